# frozen_string_literal: true

module LockManager
  module Sidekiq
    # Runs jobs under their throttles and their lock; passes every other job through untouched, at
    # no Redis cost. Holds no state between jobs (Sidekiq 6.4 builds one per job).
    class ServerMiddleware
      include ::Sidekiq::ServerMiddleware if defined?(::Sidekiq::ServerMiddleware)

      # Where a throttled job carries what its rules promised it (JobThrottle::Refusal#promises).
      PROMISES = "lock_manager_promises"
      # What a job pushed again leaves behind (#copy_of): its promises too, which a throttled job's push
      # sets anew (#with_promises) and a rescheduled one gave back.
      NOT_COPIED = ["enqueued_at", "error_class", "error_message", "error_backtrace", PROMISES].freeze

      # @return what the rest of the chain returned, as every middleware does (perform_inline takes a
      #   falsy value for a job that did not run); nil when the job's lock was held
      def call(job_instance, job, _queue, &block)
        JobBackoff.restart_after_failure(job)
        throttles = Jobs.throttles(job_instance.class)
        return locked(job_instance, job, &block).last if throttles.empty?

        value = nil
        refusal = JobThrottle.run(throttles, Jobs.class_name(job), job["jid"], job["args"], job[PROMISES]) do
          ran, value = locked(job_instance, job, &block)
          ran
        end
        refusal ? throttled(job_instance, job, refusal) : value
      end

      private

      # @return [Array(Boolean, Object)] whether the job ran (false: its lock was held), and its value
      def locked(job_instance, job)
        lock = Jobs.job_lock(job, job_instance.class)
        return [true, yield] unless lock

        value = nil
        ran = lock.run(retry_in: ->(error) { Retries.seconds_to_next_try(job_instance.class, job, error) }) do
          job.delete(JobBackoff::COUNT) # the job runs: what pushes it again later (an interrupt) starts at 0
          value = yield
        end
        conflict(job_instance, job, lock) unless ran
        [ran, value]
      end

      # A rule refused the job: it runs again when the rule would admit it (keeping its jid, so a
      # unique job's lock, held by its jid, goes with it), or waits parked for a place (a
      # concurrency rule's on_limit: :park), or OverLimit for Sidekiq's retries.
      def throttled(job_instance, job, refusal)
        refusal.handle(Jobs.class_name(job), "jid=#{job["jid"]}",
                       log: ->(line) { Jobs.log(line) },
                       reschedule: ->(delay) { push_again(job_instance, job, delay, refusal.promises) },
                       park: -> { Parking.park(with_promises(job, refusal.promises), refusal.spot(job["jid"])) })
      end

      def with_promises(job, promises)
        promises.empty? ? job.except(PROMISES) : job.merge(PROMISES => promises)
      end

      def push_again(job_instance, job, delay, promises)
        again = copy_of(job_instance, job, at: Time.now.to_f + delay, keep_jid: true)
        ::Sidekiq::Client.push(with_promises(again, promises))
      end

      def conflict(job_instance, job, lock)
        JobConflict.handle(lock, Jobs.class_name(job), job["jid"],
                           reschedules: JobBackoff.count(job), reschedule_in: reschedule_in(job_instance, job),
                           log: ->(what, key, more) { Jobs.log("#{what} #{about(job)}: #{held(lock, key)}#{more}") },
                           reschedule: ->(delay, count) { reschedule(job_instance, job, lock, delay, count) },
                           park: -> { Parking.park(job, lock.parking_spot) })
      end

      # The class's reschedule_in Proc, if any.
      def reschedule_in(job_instance, job)
        klass = Jobs.job_class(job, job_instance.class)
        klass.lock_manager_reschedule_in if klass.respond_to?(:lock_manager_reschedule_in)
      end

      def reschedule(job_instance, job, lock, delay, count)
        again = copy_of(job_instance, job, at: Time.now.to_f + delay).merge(JobBackoff::COUNT => count)
        jid = ::Sidekiq::Client.push(again)
        Jobs.log("rescheduled #{about(job)} in #{delay.round(1)}s as jid=#{jid} (reschedule #{count}): " \
                 "#{held(lock, lock.held_key)}")
      end

      def about(job)
        "#{Jobs.class_name(job)} jid=#{job["jid"]}"
      end

      def held(lock, key)
        "lock #{key.inspect} is held#{" by #{Jobs.holder_name(lock.holder)}" if lock.holder}"
      end

      # The job pushed again for later: the whole payload (its CurrentAttributes, batch, tags and
      # retry count go with it) with a new jid and enqueue time, less the error of a failure before:
      # the copy did not fail, and a job that comes with an error is a retry after a failure, whose
      # count of reschedules starts again (JobBackoff.restart_after_failure). An iterable job (Sidekiq
      # 7.3+) keeps its jid, under which Sidekiq saved its cursor: an interrupted iteration goes on
      # where it stopped.
      def copy_of(job_instance, job, at:, keep_jid: false)
        keep_jid ||= defined?(::Sidekiq::Job::Iterable) && job_instance.is_a?(::Sidekiq::Job::Iterable)
        job.except(*NOT_COPIED, *("jid" unless keep_jid)).merge("at" => at)
      end
    end
  end
end
