# frozen_string_literal: true

module LockManager
  # What the gem tells the app's logger (or raises) about a lock after its block, and about a
  # Redis that can lose locks.
  module Reports
    module_function

    # The release after a block failed: the block's work stands, the lock expires by its TTL.
    def release_failed(key, problem)
      LockManager.logger&.warn("lock #{key.inspect}: #{problem}")
    end

    # What the app is told of a lock that expired while its block ran.
    # @param result [Result] of the block that just ran
    # @param renewal [false, true, Integer] as Arguments.renewal returns it
    # @return [LockLost]
    def lost_error(key, result, ttl:, renewal:)
      LockLost.new(key, value: result.result, ran_for: result.ran_for, timeout: ttl / 1000.0,
                        renewed: renewal != false, max_hold: renewal.is_a?(Integer) ? renewal / 1000.0 : nil)
    end

    # A lost lock: a warning, or the LockLost raised with `on_lost: :raise`.
    def lost(error, on_lost:)
      raise error if on_lost == :raise

      LockManager.logger&.warn(error.message)
    end

    # Redis could not be reached for a lock, and on_redis_error says to go on without it.
    def unreachable(key, error, on_redis_error)
      going_on = on_redis_error == :run ? "running without the lock #{key.inspect}" : "treating #{key.inspect} as taken"
      LockManager.logger&.warn("#{error.message}; #{going_on} (on_redis_error: :#{on_redis_error})")
    end

    def limiter_unreachable(name, error, on_redis_error)
      going_on = on_redis_error == :run ? "running without the limiter" : "treating it as over its limit"
      LockManager.logger&.warn("#{error.message}; #{going_on} #{name.inspect} (on_redis_error: :#{on_redis_error})")
    end

    # Redis may evict keys under memory pressure: a held lock could vanish and be granted twice.
    # (Sidekiq warns about the same.)
    def eviction_policy(redis_url, policy)
      return if policy.empty? || policy == "noeviction"

      LockManager.logger&.warn("Redis at #{Arguments.redact(redis_url)} has maxmemory-policy #{policy}: under " \
                               "memory pressure it may evict a held lock, which can then be granted twice; " \
                               "set maxmemory-policy noeviction")
    end
  end
end
