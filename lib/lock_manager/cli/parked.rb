# frozen_string_literal: true

require "json"

module LockManager
  # The parked jobs' commands of `lock_manager` (on_conflict: :park), beside the locks' in cli.rb. A parked job
  # is "released" by releasing its lock (`release KEY`): the first in line takes it.
  class CLI
    # The jobs parked on `key`, first in line first, a line each, and their count.
    def parked(key)
      limit = @options.limit
      jobs = admin.parked(key, limit: limit + 1)
      @print.parked(jobs.first(limit))
      more = jobs.size > limit ? "; more not shown (--limit)" : ""
      @out.puts "#{Printer.count([jobs.size, limit].min, "parked job")} on lock #{Printer.key(key)}#{more}"
      OK
    end

    # Takes the job `jid` out of `key`'s line, when told yes or --yes: it will not run. FAILED when it was
    # not parked there.
    def delete_parked(key, jid)
      what = "job #{Printer.key(jid)} parked on lock #{Printer.key(key)}"
      return failed("#{what} not deleted") unless @options.yes || confirmed?("Delete #{what}? It will not run.")
      return failed("no #{what}") unless admin.delete_parked(key, jid)

      @out.puts "Deleted #{what}: it will not run"
      OK
    end

    # What the parked jobs' commands print (beside cli/printer.rb's).
    class Printer
      PARKED_HEADER = ["#", "JID", "CLASS", "QUEUE", "PARKED", "ARGS"].freeze

      # One line per parked job, first in line first (ARGS last: they may be long).
      def parked(jobs)
        aligned([PARKED_HEADER] + jobs.map { |job| parked_row(job) })
      end

      # "0 waiters, 3 parked jobs": who may take a lock nobody holds.
      def self.nobody(lock)
        [waiters(lock), (count(lock.parked, "parked job") if lock.parked.positive?)].compact.join(", ")
      end

      private

      # `parked`, the first jobs parked on `lock`, a line each, and how many more there are; nothing for a
      # lock no job is parked on.
      def parked_lines(lock, parked)
        return if lock.parked.zero?

        list("Parked jobs, first in line first:", parked) { |job, _| parked_line(job) }
        @out.puts "  ... #{lock.parked - parked.size} more (--limit)" if lock.parked > parked.size && parked.any?
      end

      # A job's jid, class and queue as keys are shown (quoted when odd), its args as JSON: no byte of
      # theirs reaches the terminal as a control character.
      def parked_row(job)
        [job.place.to_s, Printer.key(job.jid), Printer.key(job.job_class || "-"), Printer.key(job.queue || "-"),
         Printer.age(job.enqueued_at), JSON.generate(job.args)]
      end

      def parked_line(job)
        _, jid, job_class, queue, age, args = parked_row(job)
        @out.puts "  #{job.place}. job #{jid} #{job_class} #{args} in queue #{queue}, parked #{age}"
      end
    end
  end
end
