# frozen_string_literal: true

require_relative "parkable"

module LockManager
  class JobThrottle
    # A refusal: the rule, its limiter, seconds until it would admit the job (nil for a
    # concurrency rule, which frees a place when a job leaves: `reschedule_in`), the promises the
    # job holds now, and whether this rule's retry_after is one of them.
    Refusal = Struct.new(:throttle, :limiter, :retry_after, :promises, :promised) do
      # What on_limit: :raise raises: the limiter's name, its rule and retry_after.
      def error
        OverLimit.new(limiter.name, retry_after, limiter.rule)
      end

      # Where the job `token` (its id) parks with on_limit: :park: the concurrency rule's places.
      def spot(token)
        Parkable::Spot.new(limiter.name, token, limiter.timeout, throttle.park_limit, limiter.limit)
      end

      # What the refused job does, under Sidekiq and ActiveJob alike; each framework says only how
      # it logs a line about the job, how it runs the job again later (with #promises) and how it
      # parks it. on_limit: :raise raises OverLimit; :park parks the job until a place is free
      # (Claims#park at #spot) or, where it cannot or park_limit jobs wait already, reschedules it;
      # else the job runs again at its retry_after: its own moment when the rule promised it one,
      # else (or at the rule's reschedule_in) plus up to a tenth more, so that the jobs one refusal
      # sent away do not all come back at once.
      # @param id [String] the job's id as the line names it ("jid=…", "job_id=…")
      # @param log [#call] called with the line
      # @param reschedule [#call] called with the seconds after which the job runs again
      # @param park [#call, nil] parks the job at #spot: returns Claims#park's reply, or nil where it
      #   cannot
      def handle(class_name, id, log:, reschedule:, park: nil)
        raise error if throttle.on_limit == :raise
        return if throttle.park? && parked?("#{class_name} #{id}", park&.call, log)

        delay = delay_for_now
        reschedule.call(delay)
        log.call("throttled #{class_name} #{id}: limiter #{limiter.name.inspect} is over its limit; " \
                 "runs again in #{delay.round(1)}s")
        nil
      end

      private

      # Whether the job waits parked; else (park_limit reached, or where it cannot park) it is
      # rescheduled, as the line says.
      def parked?(about, outcome, log)
        state, count = outcome
        name = limiter.name.inspect
        case state
        when :parked then log.call("parked #{about}: limiter #{name} has no free place (#{count} in line)")
        when :handed then log.call("parked #{about}: limiter #{name} had a free place again; pushed again at once")
        when :full then log.call("not parked #{about}: #{count} wait for limiter #{name} (park_limit)")
        else log.call("not parked #{about} (a job parks where Sidekiq pushes it to the locks' Redis)")
        end
        %i[parked handed].include?(state)
      end

      def delay_for_now
        return retry_after if promised

        (retry_after || throttle.reschedule_in) * (1 + (rand / 10))
      end
    end
  end
end
