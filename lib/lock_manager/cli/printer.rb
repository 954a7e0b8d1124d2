# frozen_string_literal: true

module LockManager
  class CLI
    # What the commands print.
    class Printer
      HEADER = ["KEY", "HELD BY", "SINCE", "TTL", "WAITERS"].freeze
      LIMITER_HEADER = ["NAME", "KIND", "RULE", "USED", "REMAINING", "NEXT FREE", "RESET AFTER"].freeze
      UNITS = [[86_400, "d"], [3600, "h"], [60, "m"], [1, "s"]].freeze

      def initialize(out)
        @out = out
      end

      # One line per lock, columns aligned.
      def table(locks)
        aligned([HEADER] + locks.map { |lock| row(lock) })
      end

      # One line per rate limiter, columns aligned.
      def limiters(limiters)
        aligned([LIMITER_HEADER] + limiters.map { |limiter| limiter_row(limiter) })
      end

      # Every holder and waiter of one lock, and `parked`, the first of the jobs parked on it.
      def lock(lock, parked = [])
        @out.puts "Lock #{Printer.key(lock.key)} (#{Printer.kind(lock)})"
        list("Holders:", lock.holders) { |holder, n| holder_lines(holder, n) }
        list("Waiters, in queue order:", lock.waiters) { |waiter, n| waiter_line(waiter, n) }
        parked_lines(lock, parked)
      end

      class << self
        def holders(lock)
          return "nobody (#{nobody(lock)})" if lock.holders.empty?

          first = who(lock.holders.first)
          return first unless lock.limit

          more = lock.holders.size > 1 ? " and #{lock.holders.size - 1} more" : ""
          "#{lock.holders.size}/#{lock.limit}: #{first}#{more}"
        end

        def waiters(lock)
          count(lock.waiters.size, "waiter")
        end

        def kind(lock)
          lock.limit ? "semaphore, limit #{lock.limit}, #{count(lock.holders.size, "holder")}" : "plain lock"
        end

        # A holder or waiter: its job, its thread, or its token when it names neither.
        def who(holder)
          return "job #{holder.jid}" if holder.respond_to?(:jid) && holder.jid
          return "token #{holder.token}" unless holder.host

          "#{holder.host} pid #{holder.pid} thread #{holder.thread}"
        end

        def time(at)
          at ? "#{at.utc.strftime("%F %T UTC")} (#{age(at)})" : "unknown"
        end

        def age(at)
          at ? "#{duration(Time.now - at)} ago" : "-"
        end

        def ttl(seconds)
          seconds ? duration(seconds) : "-"
        end

        # When a limiter admits one more unit: "now" while any remain, else "in 3.2s".
        def next_free(limiter)
          (seconds = limiter.next_free_in) ? "in #{duration(seconds)}" : "now"
        end

        # "4.2s", "3m07s", "2h05m", "1d04h"
        def duration(seconds)
          seconds = [seconds, 0].max
          return format("%.1fs", seconds) if seconds < 60

          whole = seconds.to_i
          at = UNITS.index { |size, _| whole >= size }
          (big, big_unit), (small, small_unit) = UNITS[at, 2]
          "#{whole / big}#{big_unit}#{((whole % big) / small).to_s.rjust(2, "0")}#{small_unit}"
        end

        def count(number, noun)
          "#{number} #{noun}#{"s" unless number == 1}"
        end

        # A key as it is when printable; quoted when binary or holding control characters or spaces.
        def key(key)
          printable = key.encoding != Encoding::BINARY && key.valid_encoding? && !key.match?(/[[:cntrl:] ]/)
          printable ? key : key.inspect
        end
      end

      private

      def aligned(rows)
        widths = rows.transpose.map { |column| column.map(&:length).max }
        rows.each { |cells| @out.puts cells.zip(widths).map { |cell, width| cell.ljust(width) }.join("  ").rstrip }
      end

      def limiter_row(limiter)
        [Printer.key(limiter.name), limiter.kind.to_s, limiter.rule.to_s, limiter.used.to_s, limiter.remaining.to_s,
         Printer.next_free(limiter), Printer.duration(limiter.reset_after)]
      end

      def row(lock)
        holder = lock.holders.first
        [Printer.key(lock.key), Printer.holders(lock), Printer.age(holder&.since), Printer.ttl(holder&.ttl),
         "#{lock.waiters.size}#{", #{lock.parked} parked" if lock.parked.positive?}"]
      end

      def holder_lines(holder, number)
        @out.puts "  #{number}. #{Printer.who(holder)}, since #{Printer.time(holder.since)}, " \
                  "ttl #{Printer.ttl(holder.ttl)}"
        @out.puts "     token #{holder.token}"
      end

      def list(title, items, &block)
        @out.puts "#{title}#{" none" if items.empty?}"
        items.each.with_index(1, &block)
      end

      def waiter_line(waiter, number)
        @out.puts "  #{number}. #{Printer.who(waiter)}, queued since #{Printer.time(waiter.since)}"
      end
    end
  end
end
