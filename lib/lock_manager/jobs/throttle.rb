# frozen_string_literal: true

require_relative "throttle_refusal"

module LockManager
  # One `throttle_with` rule of a job class, checked at class load, and what a job's rules decide
  # when it starts, under Sidekiq and ActiveJob alike:
  #
  #   throttle_with rate: 100, per: 1, key: "partner-api"                    # shared by every job
  #   throttle_with window: 10, per: 3600, key: ->(account_id, *) { "exports:#{account_id}" }
  #   throttle_with concurrency: 5, key: ->(account_id, *) { "tenant:#{account_id}" }
  #   throttle_with concurrency: 2, key: "imports", on_limit: :park   # waits in Redis for a place
  #
  # A job starts only when all its rules admit it; one that refuses gives back what the ones
  # before it took, and the job runs again at the refusal's retry_after (see JobThrottle.run).
  # A rate rule that refuses a job promises it its unit for then, so jobs refused together come
  # back one after the other, each admitted once, rather than all at once to be refused again.
  # The promises travel with the job: { "<kind>:<limiter name>" => promise }.
  class JobThrottle
    ON_LIMIT = %i[reschedule raise park].freeze
    attr_reader :on_limit, :reschedule_in, :park_limit

    # @param key [String, Proc, nil] the limiter's name, or a Proc of the job's arguments that
    #   makes it (nil: the job's class name)
    # @param concurrency [Integer] or at most this many at once (then `timeout:` bounds how long a
    #   dead worker keeps its place, `reschedule_in:` when a refused job comes back; on_limit: :park
    #   parks a refused job until a place is free, `park_limit:` of them at most per limiter)
    # @param rule the limiter's rule otherwise: rate:/window:/sliding_window:, per:, burst:
    # @raise [ArgumentError] naming the bad option
    def initialize(key: nil, on_limit: :reschedule, concurrency: nil, timeout: 60, reschedule_in: 5, park_limit: nil,
                   **rule)
      @key = key.is_a?(Proc) || key.nil? ? key : Arguments.key(key, :key).dup.freeze
      unless ON_LIMIT.include?(on_limit)
        raise ArgumentError, "on_limit must be :reschedule, :raise or :park, got #{on_limit.inspect}"
      end

      @on_limit = on_limit
      @reschedule_in = Arguments.seconds(reschedule_in, :reschedule_in)
      concurrency ? check_concurrency(concurrency, timeout, rule) : check_rule(rule)
      check_parking(park_limit)
    end

    # Whether a job this rule refuses parks (a concurrency rule with on_limit: :park).
    def park?
      on_limit == :park
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
        job_of = { class: class_name, jid: jid }
        promises = promises&.dup || {}
        taken = []
        limiters.each do |throttle|
          refusal = take(throttle, job_of, args, promises, taken)
          return refusal if refusal
        end
        within(places, job_of, args, taken, promises, &job)
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

      # The concurrency rules, one inside the other, around the job (`of`: its class and jid).
      def within(places, of, args, taken, promises, &job)
        return (job.call ? nil : give_back(taken)) if places.empty?

        throttle, *rest = places
        limiter = throttle.limiter(of[:class], args)
        place(throttle, limiter, of) { within(rest, of, args, taken, promises, &job) }
      rescue OverLimit => e
        raise unless e.limiter == limiter&.name && e.retry_after.nil?

        give_back(taken)
        Refusal.new(throttle, limiter, nil, promises, false)
      end

      # A place of the rule's: one held by the job's id where a parked job may be handed it.
      def place(throttle, limiter, job, &block)
        throttle.park? ? limiter.within_parked(job[:jid], &block) : limiter.within_limit(&block)
      end

      def give_back(taken)
        taken.each { |limiter, limit| limiter.give_back(limit) }
        nil
      end
    end

    private

    # park_limit: only with on_limit: :park, which only a concurrency rule takes: a rate rule's
    # refused job comes back at the moment the rule promised it.
    def check_parking(park_limit)
      raise ArgumentError, "throttle_with on_limit: :park is for concurrency: rules" if park? && !concurrency?
      raise ArgumentError, "throttle_with park_limit: is for on_limit: :park" if park_limit && !park?

      @park_limit = park_limit && Arguments.positive_integer(park_limit, "throttle_with park_limit")
    end

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
