# frozen_string_literal: true

module LockManager
  # How a job with `on_conflict: :reschedule` comes back while its lock stays held, and how many
  # times: `reschedule_in:` a number (that many seconds plus up to a quarter more: a fixed interval),
  # a Proc of the attempt (1 for the first reschedule) giving seconds, or by default FIRST seconds
  # doubled at each attempt up to CAP, plus up to a quarter more. After `max_reschedules`
  # reschedules a job that meets the lock held again is skipped, or raises LockNotAcquired
  # (`when_exhausted: :raise`). The count travels with the job (COUNT) until the job gets its lock.
  class JobBackoff
    # Where a job carries how many times it was rescheduled: a Sidekiq payload's key, an ActiveJob's
    # serialized data's.
    COUNT = "lock_manager_reschedules"
    # The default's first delay, and its ceiling (both before the jitter): see docs/jobs.md.
    FIRST = 1
    CAP = 300
    # The jitter: up to this fraction more, so that jobs that met the same lock do not all come back at once.
    JITTER = 0.25
    EXHAUSTED = %w[skip raise].freeze
    NAMES = %w[reschedule_in max_reschedules when_exhausted].freeze

    # A number of seconds (nil: the default curve), or the Proc lock_with was given.
    attr_reader :reschedule_in, :max_reschedules, :when_exhausted

    # @param options [Hash] lock_with's options, String keys
    # @param reschedule [Boolean] whether on_conflict is :reschedule (max_reschedules and when_exhausted
    #   are for it alone)
    # @raise [ArgumentError] naming the bad option
    def initialize(options, reschedule:)
      @reschedule_in = interval(options["reschedule_in"])
      @max_reschedules = limit(options["max_reschedules"], reschedule)
      @when_exhausted = exhausted(options["when_exhausted"], reschedule)
      freeze
    end

    # What travels in the job's options: a number, never a Proc (it stays on the class).
    def to_h
      { "reschedule_in" => (reschedule_in unless reschedule_in.is_a?(Proc)), "max_reschedules" => max_reschedules,
        "when_exhausted" => (when_exhausted unless when_exhausted == "skip") }.compact
    end

    # Whether a job rescheduled `done` times already may not be again.
    def exhausted?(done)
      !max_reschedules.nil? && done >= max_reschedules
    end

    # Seconds until the job runs again for its `attempt`-th reschedule.
    # @param proc [Proc, nil] the class's `reschedule_in` Proc, used when the job's options give no number
    # @raise [ArgumentError] naming the class and the option when the Proc gives no positive seconds
    def delay(attempt, class_name, proc = nil)
      case (given = reschedule_in.is_a?(Numeric) ? reschedule_in : proc || reschedule_in)
      when Proc then Arguments.seconds(given.call(attempt), "#{class_name} lock_with reschedule_in(#{attempt})")
      when Numeric then jittered(given)
      else jittered([FIRST * (2**[attempt - 1, 16].min), CAP].min)
      end
    end

    class << self
      # How many times the job of this payload (Sidekiq's, or ActiveJob's serialized data) was rescheduled.
      def count(payload)
        count = payload[COUNT]
        count.is_a?(Integer) && count.positive? ? count : 0
      end

      # Sidekiq's retry brings a job back as it started, its count too: a job that ran and failed in its own
      # code (it had its lock) starts counting again, in the payload and in a wrapped ActiveJob's data. A job
      # that gave up on its lock (LockNotAcquired, when_exhausted: :raise) keeps its count: each retry that
      # still finds the lock held raises again, on Sidekiq's retry schedule, until its retries run out.
      def restart_after_failure(job)
        return if job["error_class"].nil? || job["error_class"] == LockNotAcquired.name

        job.delete(COUNT)
        data = Array(job["args"]).first if job["wrapped"]
        data.delete(COUNT) if data.is_a?(Hash)
      end
    end

    private

    def jittered(seconds)
      seconds * (1 + (rand * JITTER))
    end

    def interval(value)
      return value if value.nil?
      return Arguments.seconds(value, "lock_with reschedule_in") unless value.is_a?(Proc)
      return value if !value.lambda? || value.arity == 1 || value.arity.between?(-2, -1)

      raise ArgumentError, "lock_with reschedule_in must be seconds or a Proc of the attempt (1, 2, ...), " \
                           "got a lambda of #{value.arity} arguments"
    end

    def limit(value, reschedule)
      return if value.nil?

      only_for_reschedule("max_reschedules", reschedule)
      return value if value.is_a?(Integer) && value >= 0

      raise ArgumentError, "lock_with max_reschedules must be an Integer, 0 or more, got #{value.inspect}"
    end

    def exhausted(value, reschedule)
      return "skip" if value.nil?

      only_for_reschedule("when_exhausted", reschedule)
      raise ArgumentError, "lock_with when_exhausted needs max_reschedules" if max_reschedules.nil?
      return value.to_s if (value.is_a?(Symbol) || value.is_a?(String)) && EXHAUSTED.include?(value.to_s)

      raise ArgumentError, "lock_with when_exhausted must be one of :skip, :raise, got #{value.inspect}"
    end

    def only_for_reschedule(name, reschedule)
      raise ArgumentError, "lock_with #{name} is for on_conflict: :reschedule" unless reschedule
    end
  end
end
