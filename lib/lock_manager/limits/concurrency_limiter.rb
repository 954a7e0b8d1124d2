# frozen_string_literal: true

module LockManager
  # At most `limit` blocks at once across processes: the lock's own semaphore (`limit:` of a lock
  # call, with its hand-off to waiters), renewed while each block runs, so a holder that dies
  # frees its place within `timeout` and a long block keeps it. Made by Limiter.concurrent.
  class ConcurrencyLimiter
    attr_reader :name, :limit, :timeout

    def initialize(name, limit, timeout:, locker: nil)
      @name = Arguments.key(name, :name).dup.freeze
      @limit = Arguments.positive_integer(limit, :limit)
      @timeout = Arguments.seconds(timeout, :timeout)
      @locker = locker
    end

    # Runs the block in one of the `limit` places, waiting up to `wait` seconds for one (nil: none).
    # The block receives the lock's Result (its fencing_token, lost?).
    # @return the block's value
    # @raise [OverLimit] when every place stayed taken
    def within_limit(wait: nil, &block)
      raise ArgumentError, "a block is required" unless block
      return locked(wait, &block) unless wait.nil? || wait == 0 # rubocop:disable Style/NumericPredicate -- nil too

      result = locker.nonblocking_lock(name, timeout: @timeout, limit: limit, renew: true, &block)
      result.run? ? result.result : raise(full)
    rescue AlreadyHeld # limit 1, and this thread is in it
      raise full
    end

    # #within_limit in a place held by `token` (a job's id): the one a release handed to it while it
    # was parked (Claims#park), or a free one. Its release hands the place to the next parked job.
    # @return the block's value
    # @raise [OverLimit] when every place is taken
    # @api private
    def within_parked(token)
      lock = locker.adopt(name, token, timeout: @timeout, limit: limit)
      raise full unless lock.is_a?(Lock)

      begin
        yield
      ensure
        lock.release_parked
      end
    rescue AlreadyHeld # limit 1, and this thread is in it
      raise full
    end

    # The rule as messages and events show it.
    def rule
      "#{limit} at once"
    end

    def inspect
      "#<#{self.class} #{name.inspect} #{rule}>"
    end

    private

    def locked(wait, &block)
      locker.blocking_lock(name, timeout: @timeout, limit: limit, renew: true, wait: wait, &block)
    rescue LockNotAcquired
      raise full
    end

    def full
      OverLimit.new(name, nil, rule)
    end

    def locker
      @locker || LockManager.locker
    end
  end
end
