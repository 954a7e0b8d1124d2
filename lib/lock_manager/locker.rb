# frozen_string_literal: true

module LockManager
  # Locks on one Redis, with a pool of its own. `LockManager::Locker.nonblocking_lock` and
  # `.blocking_lock` use the shared one built from LockManager.config.
  class Locker
    DEFAULT_TIMEOUT = 30

    Result = LockManager::Result

    class << self
      # The shared Locker built from LockManager.config.
      def instance
        LockManager.locker
      end

      def nonblocking_lock(key, **options, &block)
        instance.nonblocking_lock(key, **options, &block)
      end

      def blocking_lock(key, **options, &block)
        instance.blocking_lock(key, **options, &block)
      end
    end

    # @param options the settings of LockManager.configure; those not given come from LockManager.config
    # @raise [ArgumentError] naming the first bad option
    def initialize(**options)
      @settings = Configuration.check(LockManager.config.locker_options.merge(options)).freeze
      @native = Native::Locker.new(*@settings.values_at(:redis_url, :pool_size, :pool_timeout, :connect_timeout,
                                                        :read_timeout, :retry_interval, :key_prefix, :sentinels,
                                                        :sentinel_master, :cluster, :min_replicas,
                                                        :replica_timeout))
    end

    # Runs the block only if the lock is free right now. A block that takes an argument gets the
    # Result while it runs: its fencing_token, and lost? (which renewal keeps up to date).
    # @param timeout [Numeric] seconds the lock lives (renewed by `renew: true` while the block runs)
    # @param limit [Integer] how many callers may hold the key at once (1: a plain lock)
    # @param renew [Boolean] keep the lock alive while the block runs, for `max_hold` seconds at most
    # @return [Result] run? is false (and the block skipped) when the lock is taken
    def nonblocking_lock(key, timeout: DEFAULT_TIMEOUT, limit: 1, renew: renew?, max_hold: nil, &block)
      synchronize(key, timeout, limit, wait: false, fair: false, renew: renew, max_hold: max_hold, &block) ||
        Result.new(false)
    end

    # Waits up to `timeout` seconds for the lock, then runs the block. The wait is woken by the
    # release (in any process), or when the holder's TTL runs out; it does not poll.
    # @param limit [Integer] how many callers may hold the key at once (1: a plain lock)
    # @param fair [Boolean] waiters take the lock in arrival order, across threads and processes
    # @param renew [Boolean] keep the lock alive while the block runs, for `max_hold` seconds at most
    # @return the block's value
    # @raise [LockNotAcquired] when the lock stays taken for the whole wait
    def blocking_lock(key, timeout: DEFAULT_TIMEOUT, limit: 1, fair: fair?, renew: renew?, max_hold: nil, &block)
      synchronize(key, timeout, limit, wait: true, fair: fair, renew: renew, max_hold: max_hold, &block).result
    end

    # @return [Lock, nil] nil when someone else holds the lock
    def try_lock(key, timeout: DEFAULT_TIMEOUT, renew: renew?, max_hold: nil)
      key = Arguments.key(key).dup.freeze # the Lock keeps it: the caller may change theirs
      native = @native.lock(key, Arguments.milliseconds(timeout, :timeout), nil, false, renewal(renew, max_hold))
      check_eviction_policy unless @eviction_policy_checked
      native && Lock.new(key, native)
    end

    # @return [Lock]
    # @raise [LockNotAcquired] when the lock stays held for `timeout` seconds
    def lock(key, timeout: DEFAULT_TIMEOUT, fair: fair?, renew: renew?, max_hold: nil)
      key = Arguments.key(key).dup.freeze # the Lock keeps it: the caller may change theirs
      ttl = Arguments.milliseconds(timeout, :timeout)
      native = @native.lock(key, ttl, ttl / 1000.0, Arguments.boolean(fair, :fair), renewal(renew, max_hold))
      check_eviction_policy unless @eviction_policy_checked
      Lock.new(key, native)
    end

    # @return [Boolean] whether blocking waits are fair unless told otherwise
    def fair?
      @settings[:fair]
    end

    # @return [Boolean] whether locks are renewed while held unless told otherwise
    def renew?
      @settings[:renew]
    end

    # @return [Boolean] true if anyone holds the lock
    def locked?(key)
      @native.locked?(Arguments.key(key))
    end

    # @return [Array(Integer, Integer)] open and idle connections of this process's pool
    def pool_state
      @native.pool_state
    end

    def settings
      Arguments::Topology.redacted(@settings)
    end

    def inspect
      "#<#{self.class} #{settings.map { |k, v| "#{k}=#{v.inspect}" }.join(" ")}>"
    end

    private

    # Checks the arguments of a block call, then runs the block under the lock. The hot path of
    # every lock call: it builds no arrays or hashes, and does not make the block a Proc (see
    # Result#yield_to).
    # @return [Result, nil] nil when the lock was taken
    def synchronize(key, timeout, limit, wait:, fair:, renew:, max_hold:, &block)
      raise ArgumentError, "a block is required" unless block_given?

      ttl = Arguments.milliseconds(timeout, :timeout)
      result = run_locked(Arguments.key(key), ttl, Arguments.positive_integer(limit, :limit),
                          wait: wait ? ttl / 1000.0 : nil, fair: Arguments.boolean(fair, :fair),
                          renewal: renewal(renew, max_hold), &block)
      check_eviction_policy unless @eviction_policy_checked
      result
    end

    # Runs the block under the lock; a lock lost meanwhile, or not released, is reported.
    def run_locked(key, ttl, limit, wait:, fair:, renewal:, &block)
      result = raised = nil
      outcome = @native.synchronize(key, ttl, wait, limit, fair, renewal) do |fencing_token, lock|
        result = Result.new(true, fencing_token: fencing_token, lock: lock)
        result.yield_to(&block)
      rescue Exception => e # rubocop:disable Lint/RescueException -- re-raised once the lock is released
        raised = e
      end
      return if outcome.nil?

      held = held_to_the_end?(key, outcome, raised)
      Reports.lost(key, result, ttl: ttl, renewal: renewal, on_lost: @settings[:on_lost]) unless held
      result.finish(lost: !held)
    end

    # The extension's word on the release after the block: true or false, or [held, problem]
    # when the release failed (logged: it cannot change what the block did). The block's own
    # exception, if any, goes on from here.
    def held_to_the_end?(key, outcome, raised)
      if outcome.is_a?(Array)
        held, problem = outcome
        Reports.release_failed(key, problem)
      else
        held = outcome
      end
      raise raised if raised

      held
    end

    # Once per Locker, as soon as it has connected.
    def check_eviction_policy
      policy = @native.maxmemory_policy or return

      @eviction_policy_checked = true
      Reports.eviction_policy(@settings[:redis_url], policy)
    end

    def renewal(renew, max_hold)
      Arguments.renewal(renew, max_hold, default_max_hold: @settings[:max_hold])
    end
  end
end
