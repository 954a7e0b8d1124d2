# frozen_string_literal: true

module LockManager
  # Locks on one Redis, with a pool of its own. `LockManager::Locker.nonblocking_lock` and
  # `.blocking_lock` use the shared one built from LockManager.config.
  class Locker
    include Claims
    include BlockCalls

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
      @settings = Configuration.check(LockManager.config.raw_options.merge(options)).freeze
      tls = Arguments::Tls::Material.read(@settings)
      @native = Native::Locker.new(@settings.merge(tls: tls))
      LockManager.config.logger&.warn(Arguments::Tls::Material::UNVERIFIED) if tls && !tls[:verify]
    end

    # Runs the block only if the lock is free right now. A block that takes an argument gets the
    # Result while it runs: its fencing_token, and lost? (which renewal keeps up to date).
    # @param timeout [Numeric] seconds the lock lives (renewed by `renew: true` while the block runs)
    # @param limit [Integer] how many callers may hold the key at once (1: a plain lock)
    # @param renew [Boolean] keep the lock alive while the block runs, for `max_hold` seconds at most
    # @param on_redis_error [Symbol, nil] :raise, :run or :skip when Redis cannot be reached (nil: the setting)
    # @return [Result] run? is false (and the block skipped) when the lock is taken
    def nonblocking_lock(key, timeout: DEFAULT_TIMEOUT, limit: 1, renew: renew?, max_hold: nil, on_redis_error: nil,
                         &block)
      synchronize(key, timeout, limit, false, false, renew, max_hold, on_redis_error, &block) || Result.new(false)
    end

    # Waits up to `timeout` seconds for the lock, then runs the block. The wait is woken by the
    # release (in any process), or when the holder's TTL runs out; it does not poll.
    # @param limit [Integer] how many callers may hold the key at once (1: a plain lock)
    # @param fair [Boolean] waiters take the lock in arrival order, across threads and processes
    # @param renew [Boolean] keep the lock alive while the block runs, for `max_hold` seconds at most
    # @param on_redis_error [Symbol, nil] :raise, :run or :skip when Redis cannot be reached (nil: the setting)
    # @param wait [Numeric, nil] seconds to wait for the lock (nil: `timeout`)
    # @return the block's value
    # @raise [LockNotAcquired] when the lock stays taken for the whole wait
    def blocking_lock(key, timeout: DEFAULT_TIMEOUT, limit: 1, fair: fair?, renew: renew?, max_hold: nil,
                      on_redis_error: nil, wait: nil, &block)
      wait = wait ? Arguments.seconds(wait, :wait) : true
      synchronize(key, timeout, limit, wait, fair, renew, max_hold, on_redis_error, &block).result
    end

    # @return [Lock, nil] nil when someone else holds the lock
    def try_lock(key, timeout: DEFAULT_TIMEOUT, renew: renew?, max_hold: nil)
      key = Arguments.key(key).dup.freeze # the Lock keeps it: the caller may change theirs
      ttl = Arguments.milliseconds(timeout, :timeout)
      renewal = renewal(renew, max_hold)
      lock = Instrumentation.acquiring(key, :try_lock) { native.lock(key, ttl, nil, false, renewal) }
      check_eviction_policy unless @eviction_policy_checked
      LeaseEvents.watch if lock && renewal
      lock && Lock.new(key, lock)
    end

    # @param wait [Numeric, nil] seconds to wait for the lock (nil: `timeout`)
    # @return [Lock]
    # @raise [LockNotAcquired] when the lock stays held for the whole wait
    def lock(key, timeout: DEFAULT_TIMEOUT, fair: fair?, renew: renew?, max_hold: nil, wait: nil)
      key = Arguments.key(key).dup.freeze # the Lock keeps it: the caller may change theirs
      ttl = Arguments.milliseconds(timeout, :timeout)
      wait = wait ? Arguments.seconds(wait, :wait).to_f : ttl / 1000.0
      fair = Arguments.boolean(fair, :fair)
      renewal = renewal(renew, max_hold)
      lock = Instrumentation.acquiring(key, :lock) { native.lock(key, ttl, wait, fair, renewal) }
      check_eviction_policy unless @eviction_policy_checked
      LeaseEvents.watch if renewal
      Lock.new(key, lock)
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
      native.locked?(Arguments.key(key))
    end

    # @return [Array(Integer, Integer)] open and idle connections of this process's pool
    def pool_state
      native.pool_state
    end

    # The extension object behind this Locker (LockManager::Testing's while it is on): for
    # LockManager::Admin, which reads through the same pool and key prefix.
    # @api private
    def backend
      native
    end

    # @return [Symbol] what a lock call does when Redis cannot be reached: :raise, :run or :skip
    def on_redis_error
      @settings[:on_redis_error]
    end

    def settings
      Arguments::Topology.redacted(@settings)
    end

    def inspect
      "#<#{self.class} #{settings.map { |k, v| "#{k}=#{v.inspect}" }.join(" ")}>"
    end

    private

    # The extension, or the in-process one of LockManager::Testing while it is on.
    def native
      LockManager.testing_backend || @native
    end

    # Once per Locker, as soon as it has connected.
    def check_eviction_policy
      policy = native.maxmemory_policy or return

      @eviction_policy_checked = true
      Reports.eviction_policy(@settings[:redis_url], policy)
    end

    def renewal(renew, max_hold)
      Arguments.renewal(renew, max_hold, @settings[:max_hold])
    end
  end
end
