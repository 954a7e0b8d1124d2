# frozen_string_literal: true

require_relative "limits/rule"

module LockManager
  # What one decision of a Limiter said: admitted or not, the units that could go right now, and
  # in seconds how long until this call would be admitted (0 when it was) and until the limiter
  # is back to full. (`receipt`: what Limiter#give_back needs; for a job's refusal, its promise.)
  Limit = Struct.new(:admitted, :remaining, :retry_after, :reset_after, :receipt) do
    def admitted?
      admitted
    end

    # A job's refusal that holds a promise: the units are its when it comes back at retry_after.
    # @api private
    def promise
      receipt if !admitted && receipt&.any?(&:nonzero?)
    end

    def inspect
      "#<#{self.class} admitted?: #{admitted}, retry_after: #{retry_after.round(6)}, remaining: #{remaining}>"
    end
    alias_method :to_s, :inspect
  end

  # A rate limit kept in Redis, exact across threads and processes: every decision is one round
  # trip, one script against Redis's clock (never this machine's), and says exactly when to come
  # back. Its key lives under the Locker's key prefix, in one hash slot, and expires once idle.
  #
  #   api = LockManager::Limiter.new("partner-api", rate: 100, per: 1, burst: 20)
  #   api.within_limit { call_partner }                 # raises OverLimit when over
  #   LockManager::Limiter.window("exports:#{id}", 10, per: 3600).try_acquire # => #<LockManager::Limit ...>
  class Limiter
    attr_reader :name, :rule

    # How long a job back for its promise may wait for it, rather than leave again: a scheduler
    # brings jobs back late by different amounts (Sidekiq's poll), and a smooth rate admits each
    # only one interval after the one before it.
    PROMISE_WAIT = 1.0

    class << self
      # At most `limit` per window of `per` seconds, the windows aligned to Redis's clock.
      def window(name, limit, per:, locker: nil)
        new(name, window: limit, per: per, locker: locker)
      end

      # At most `limit` in any `per` seconds ending now, exactly (one sorted-set member per unit).
      def sliding_window(name, limit, per:, locker: nil)
        new(name, sliding_window: limit, per: per, locker: locker)
      end

      # At most `limit` blocks at once: the lock's semaphore (`limit:`), renewed while the block runs.
      def concurrent(name, limit, timeout: Locker::DEFAULT_TIMEOUT, locker: nil)
        ConcurrencyLimiter.new(name, limit, timeout: timeout, locker: locker)
      end

      # The limiter `name` of a Rule checked before: a job's throttle_with rule, made for each job.
      # @api private
      def of_rule(name, rule)
        allocate.tap { |limiter| limiter.send(:setup, name, rule, nil) }
      end
    end

    # @param rate [Numeric] a smooth rate: `rate` per `per` seconds, `burst` at once from idle
    # @param window [Integer] or at most this many per window of `per` seconds
    # @param sliding_window [Integer] or at most this many in any `per` seconds
    # @param locker [Locker, nil] whose Redis and key prefix (nil: the shared one, when first used)
    # @raise [ArgumentError] naming the first bad option
    def initialize(name, per: 1, rate: nil, window: nil, sliding_window: nil, burst: nil, locker: nil)
      setup(name, Rule.from(per: per, rate: rate, window: window, sliding_window: sliding_window, burst: burst),
            locker)
    end

    # One decision, one round trip: takes `cost` units if the limit allows.
    # @param wait [Numeric, nil] seconds to wait while refused (waits out retry_after; nil: none)
    # @return [Limit]
    def try_acquire(cost: 1, wait: nil)
      cost = rule.check_cost(cost)
      wait = wait.nil? || wait == 0 ? nil : Arguments.seconds(wait, :wait).to_f # rubocop:disable Style/NumericPredicate
      decide(cost, wait, nil, nil)
    end

    # One unit for a job's rule (throttle_with): `job` ({ class:, jid: }) joins the event's payload.
    # A refusal takes a promise of the unit for when the job comes back (Limit#promise); `promise`
    # redeems the one an earlier refusal gave, waiting for it up to PROMISE_WAIT.
    # When Redis cannot be reached, the Locker's on_redis_error: raised, or (logged) nil for :run,
    # the rule passed over, and a refusal with no retry_after for :skip.
    # @api private
    # @return [Limit, nil]
    def try_acquire_for(job, promise = nil)
      decide(1, promise && PROMISE_WAIT, job, promise || true)
    rescue ConnectionError => e
      Limit.new(false, 0, nil, nil) unless unreachable(e, locker.on_redis_error) == :run
    end

    # Runs the block if the limit admits `cost` units (waiting up to `wait` seconds for them).
    # When Redis cannot be reached, `on_redis_error` (else the Locker's setting) says what
    # happens: :raise, :run (the block runs, unlimited) or :skip (it does not; nil).
    # @return the block's value
    # @raise [OverLimit] with retry_after, when not admitted
    def within_limit(cost: 1, wait: nil, on_redis_error: nil)
      raise ArgumentError, "a block is required" unless block_given?

      on_redis_error = Arguments.on_redis_error(on_redis_error || locker.on_redis_error, :on_redis_error)
      begin
        limit = try_acquire(cost: cost, wait: wait)
      rescue ConnectionError => e
        return unreachable(e, on_redis_error) == :run ? yield(nil) : nil
      end
      raise OverLimit.new(name, limit.retry_after, rule) unless limit.admitted?

      yield limit
    end

    # Gives back the units an admitted decision took (`cost` as asked): for a call that will not
    # happen after all, such as a job another of its rules refused. A decision not admitted took
    # nothing.
    def give_back(limit, cost: 1)
      native.give_back(rule.check_cost(cost), limit.receipt) if limit.admitted?
      nil
    end

    # Forgets what the limiter has counted.
    # @return [Boolean] whether it had counted anything
    def reset
      native.reset
    end

    def inspect
      "#<#{self.class} #{name.inspect} #{rule}>"
    end

    private

    def setup(name, rule, locker)
      @name = Arguments.key(name, :name).dup.freeze
      @rule = rule
      @locker = locker
      @native = @backend = nil
    end

    def decide(cost, wait, job, promise)
      limit = Limit.new(*native.decide(cost, wait, promise)).freeze
      Instrumentation.throttled(self, cost, limit, job) if Events.on?(Instrumentation::THROTTLE)
      limit
    end

    def locker
      @locker || LockManager.locker
    end

    # Raises `error` unless on_redis_error says to go on; logs it when it does.
    def unreachable(error, on_redis_error)
      raise error if on_redis_error == :raise

      Reports.limiter_unreachable(name, error, on_redis_error)
      on_redis_error
    end

    # The extension's limiter, on the Locker's backend as it is now (LockManager::Testing's while
    # it is on); made again when that changes.
    def native
      backend = locker.backend
      return @native if backend.equal?(@backend)

      @native = backend.limiter(name, rule.kind.to_s, rule.amount, rule.per, rule.burst)
      @backend = backend
      @native
    end
  end
end
