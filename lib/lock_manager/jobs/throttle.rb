# frozen_string_literal: true

module LockManager
  # One `throttle_with` rule of a job class, checked at class load, and what a job's rules decide
  # when it starts, under Sidekiq and ActiveJob alike:
  #
  #   throttle_with rate: 100, per: 1, key: "partner-api"                    # shared by every job
  #   throttle_with window: 10, per: 3600, key: ->(account_id, *) { "exports:#{account_id}" }
  #   throttle_with concurrency: 5, key: ->(account_id, *) { "tenant:#{account_id}" }
  #
  # A job starts only when all its rules admit it; one that refuses gives back what the ones
  # before it took, and the job runs again at the refusal's retry_after (see JobThrottle.run).
  # A rate rule that refuses a job promises it its unit for then, so jobs refused together come
  # back one after the other, each admitted once, rather than all at once to be refused again.
  # The promises travel with the job: { "<kind>:<limiter name>" => promise }.
  class JobThrottle
    ON_LIMIT = %i[reschedule raise].freeze
    # A refusal: the rule, its limiter, seconds until it would admit the job (nil for a
    # concurrency rule, which frees a place when a job leaves: `reschedule_in`), the promises the
    # job holds now, and whether this rule's retry_after is one of them.
    Refusal = Struct.new(:throttle, :limiter, :retry_after, :promises, :promised) do
      # What on_limit: :raise raises: the limiter's name, its rule and retry_after.
      def error
        OverLimit.new(limiter.name, retry_after, limiter.rule)
      end
    end

    attr_reader :on_limit, :reschedule_in

    # @param key [String, Proc, nil] the limiter's name, or a Proc of the job's arguments that
    #   makes it (nil: the job's class name)
    # @param concurrency [Integer] or at most this many at once (then `timeout:` bounds how long a
    #   dead worker keeps its place, `reschedule_in:` when a refused job comes back)
    # @param rule the limiter's rule otherwise: rate:/window:/sliding_window:, per:, burst:
    # @raise [ArgumentError] naming the bad option
    def initialize(key: nil, on_limit: :reschedule, concurrency: nil, timeout: 60, reschedule_in: 5, **rule)
      @key = key.is_a?(Proc) || key.nil? ? key : Arguments.key(key, :key).dup.freeze
      unless ON_LIMIT.include?(on_limit)
        raise ArgumentError, "on_limit must be :reschedule or :raise, got #{on_limit.inspect}"
      end

      @on_limit = on_limit
      @reschedule_in = Arguments.seconds(reschedule_in, :reschedule_in)
      concurrency ? check_concurrency(concurrency, timeout, rule) : check_rule(rule)
    end

    def concurrency?
      @rule.nil?
    end

    # The rule's limiter for a job of `class_name` with these arguments.
    def limiter(class_name, args)
      name = @key.is_a?(Proc) ? Arguments.key(@key.call(*args), :key) : (@key || class_name)
      return Limiter.of_rule(name, @rule) unless concurrency?

      ConcurrencyLimiter.new(name, @places, timeout: @timeout)
    end

    class << self
      # Runs the block (the job) when every rule admits it: the limiters first, in order, then the
      # concurrency rules around the block. A refusal gives back what the rules before it took, and
      # so does a block that says it did not run the job (its lock was held).
      # @param jid [String] the job's id (Sidekiq's jid, ActiveJob's job_id), for the events
      # @param promises [Hash, nil] what earlier refusals promised the job (Refusal#promises)
      # @yieldreturn [Boolean] whether the job ran
      # @return [Refusal, nil] nil when the rules admitted the job
      def run(throttles, class_name, jid, args, promises = nil, &job)
        limiters, places = throttles.partition { |throttle| !throttle.concurrency? }
        promises = promises&.dup || {}
        taken = []
        limiters.each do |throttle|
          refusal = take(throttle, { class: class_name, jid: jid }, args, promises, taken)
          return refusal if refusal
        end
        within(places, class_name, args, taken, promises, &job)
      end

      # What a refused job does, under Sidekiq and ActiveJob alike; each framework says only how it
      # logs a line about the job and how it runs the job again later (with Refusal#promises).
      # on_limit: :raise raises OverLimit; else the job runs again at its retry_after: its own
      # moment when the rule promised it one, else (or at the rule's reschedule_in) plus up to a
      # tenth more, so that the jobs one refusal sent away do not all come back at once.
      # @param id [String] the job's id as the line names it ("jid=…", "job_id=…")
      # @param log [#call] called with the line
      # @param reschedule [#call] called with the seconds after which the job runs again
      def handle(refusal, class_name, id, log:, reschedule:)
        raise refusal.error if refusal.throttle.on_limit == :raise

        delay = delay(refusal)
        reschedule.call(delay)
        log.call("throttled #{class_name} #{id}: limiter #{refusal.limiter.name.inspect} is over its limit; " \
                 "runs again in #{delay.round(1)}s")
        nil
      end

      private

      # One rate rule's unit for the job, added to `taken`; or the Refusal, once what the rules
      # before it took is given back.
      def take(throttle, job, args, promises, taken)
        limiter = throttle.limiter(job[:class], args)
        limit = decide(limiter, job, promises) or return # unreachable, :run
        if limit.admitted?
          taken << [limiter, limit]
          return
        end

        give_back(taken)
        Refusal.new(throttle, limiter, limit.retry_after, promises, !limit.promise.nil?)
      end

      # The limiter's decision for the job, redeeming the promise it holds there (gone from
      # `promises` once asked for) and keeping the one a refusal gives.
      def decide(limiter, job, promises)
        promised_as = "#{limiter.rule.kind}:#{limiter.name}"
        limit = limiter.try_acquire_for(job, promises.delete(promised_as))
        promises[promised_as] = limit.promise if limit&.promise
        limit
      end

      def delay(refusal)
        return refusal.retry_after if refusal.promised

        (refusal.retry_after || refusal.throttle.reschedule_in) * (1 + (rand / 10))
      end

      # The concurrency rules, one inside the other, around the job.
      def within(places, class_name, args, taken, promises, &job)
        return (job.call ? nil : give_back(taken)) if places.empty?

        throttle, *rest = places
        limiter = throttle.limiter(class_name, args)
        limiter.within_limit { within(rest, class_name, args, taken, promises, &job) }
      rescue OverLimit => e
        raise unless e.limiter == limiter&.name && e.retry_after.nil?

        give_back(taken)
        Refusal.new(throttle, limiter, nil, promises, false)
      end

      def give_back(taken)
        taken.each { |limiter, limit| limiter.give_back(limit) }
        nil
      end
    end

    private

    def check_rule(rule)
      @rule = Limiter::Rule.from(**{ per: 1, **rule }).freeze
    end

    # The places and timeout, checked once (the limiter's name comes with each job).
    def check_concurrency(concurrency, timeout, rule)
      raise ArgumentError, "concurrency: takes no #{rule.keys.first}:" unless rule.empty?

      @places = Arguments.positive_integer(concurrency, :concurrency)
      @timeout = Arguments.seconds(timeout, :timeout)
    end
  end
end
