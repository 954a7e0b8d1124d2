# frozen_string_literal: true

module LockManager
  # Defined by the native extension (ext/lock_manager/src/locker.rs); this file adds the Ruby
  # API around it: keyword arguments, argument checks, and the class-level shared instance.
  class Locker
    DEFAULT_TIMEOUT = 30

    Result = LockManager::Result

    private :native_synchronize, :native_try_acquire, :native_acquire, :native_release,
            :native_refresh, :native_owned, :native_locked

    class << self
      # A Locker with its own pool; options not given come from LockManager.config.
      def new(**options)
        settings = Configuration.check(LockManager.config.locker_options.merge(options)).freeze
        locker = native_new(*settings.values_at(:redis_url, :pool_size, :pool_timeout, :connect_timeout,
                                                :read_timeout, :retry_interval, :key_prefix))
        # `fair` is a Ruby-side default: the native Locker takes it per call.
        locker.instance_variable_set(:@settings, settings)
        locker
      end

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

      private :native_new
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
      fair = Arguments.boolean(fair, :fair)
      synchronize(key, timeout, limit, wait: true, fair: fair, renew: renew, max_hold: max_hold, &block).result
    end

    # @return [Lock, nil] nil when someone else holds the lock
    def try_lock(key, timeout: DEFAULT_TIMEOUT, renew: renew?, max_hold: nil)
      key = Arguments.key(key).dup.freeze # the Lock keeps it: the caller may change theirs
      ttl = Arguments.milliseconds(timeout, :timeout)
      taken = native_try_acquire(key, ttl, renew, renewal_cap(renew, max_hold))
      taken && handle(key, *taken, renewed: renew)
    end

    # @return [Lock]
    # @raise [LockNotAcquired] when the lock stays held for `timeout` seconds
    def lock(key, timeout: DEFAULT_TIMEOUT, fair: fair?, renew: renew?, max_hold: nil)
      key = Arguments.key(key).dup.freeze # the Lock keeps it: the caller may change theirs
      ttl = Arguments.milliseconds(timeout, :timeout)
      fair = Arguments.boolean(fair, :fair)
      handle(key, *native_acquire(key, ttl, ttl / 1000.0, fair, renew, renewal_cap(renew, max_hold)), renewed: renew)
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
      native_locked(Arguments.key(key))
    end

    def settings
      @settings.merge(redis_url: Arguments.redact(@settings[:redis_url]))
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
      max_hold_ms = renewal_cap(renew, max_hold)
      run_locked(Arguments.key(key), ttl, Arguments.positive_integer(limit, :limit),
                 wait: wait ? ttl / 1000.0 : nil, fair: fair, renew: renew, max_hold_ms: max_hold_ms, &block)
    end

    # Runs the block under the lock; a lock lost meanwhile is reported as on_lost says.
    def run_locked(key, ttl, limit, wait:, fair:, renew:, max_hold_ms:, &block)
      result = value = started = nil
      held = native_synchronize(key, ttl, wait, limit, fair, renew, max_hold_ms) do |fencing_token, lease|
        result = Result.new(true, fencing_token: fencing_token, lease: lease)
        started = monotonic
        value = result.yield_to(&block)
      end
      return if held.nil?

      lost(key, value, ran_for: monotonic - started, ttl: ttl, renew: renew, max_hold_ms: max_hold_ms) unless held
      result.finish(value, lost: !held)
    end

    def lost(key, value, ran_for:, ttl:, renew:, max_hold_ms:)
      error = LockLost.new(key, value: value, ran_for: ran_for, timeout: ttl / 1000.0, renewed: renew,
                                max_hold: max_hold_ms && (max_hold_ms / 1000.0))
      raise error if @settings[:on_lost] == :raise

      LockManager.logger&.warn(error.message)
    end

    # Checks `renew` and `max_hold` together.
    # @return [Integer, nil] how many ms the renewal may go on (nil: no cap, or no renewal)
    def renewal_cap(renew, max_hold)
      Arguments.boolean(renew, :renew)
      raise ArgumentError, "max_hold needs renew: true (without renewal the lock lives `timeout`)" if max_hold && !renew
      return unless renew

      max_hold ||= @settings[:max_hold]
      max_hold && Arguments.milliseconds(max_hold, :max_hold)
    end

    def monotonic
      Process.clock_gettime(Process::CLOCK_MONOTONIC)
    end

    def handle(key, token, fencing_token, lease, renewed:)
      Lock.new(self, key, token, fencing_token: fencing_token, lease: lease, renewed: renewed)
    end
  end
end
