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

    # The lock expired while its block ran: a warning, or LockLost with `on_lost: :raise`.
    # @param result [Result] of the block that just ran
    # @param renewal [false, true, Integer] as Arguments.renewal returns it
    def lost(key, result, ttl:, renewal:, on_lost:)
      error = LockLost.new(key, value: result.result, ran_for: result.ran_for, timeout: ttl / 1000.0,
                                renewed: renewal != false, max_hold: renewal.is_a?(Integer) ? renewal / 1000.0 : nil)
      raise error if on_lost == :raise

      LockManager.logger&.warn(error.message)
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
