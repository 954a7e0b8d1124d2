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

      def nonblocking_lock(key, timeout: DEFAULT_TIMEOUT, limit: 1, &block)
        instance.nonblocking_lock(key, timeout: timeout, limit: limit, &block)
      end

      def blocking_lock(key, timeout: DEFAULT_TIMEOUT, limit: 1, fair: instance.fair?, &block)
        instance.blocking_lock(key, timeout: timeout, limit: limit, fair: fair, &block)
      end

      private :native_new
    end

    # Runs the block only if the lock is free right now.
    # @param limit [Integer] how many callers may hold the key at once (1: a plain lock)
    # @return [Result] run? is false (and the block skipped) when the lock is taken
    def nonblocking_lock(key, timeout: DEFAULT_TIMEOUT, limit: 1, &block)
      key, ttl, limit = lock_arguments(key, timeout, limit, block)
      held, value = synchronize(key, ttl, nil, limit, false, &block)
      held.nil? ? Result.new(false) : Result.new(true, value, lost: !held)
    end

    # Waits up to `timeout` seconds for the lock, then runs the block. The wait is woken by the
    # release (in any process), or when the holder's TTL runs out; it does not poll.
    # @param limit [Integer] how many callers may hold the key at once (1: a plain lock)
    # @param fair [Boolean] waiters take the lock in arrival order, across threads and processes
    # @return the block's value
    # @raise [LockNotAcquired] when the lock stays taken for the whole wait
    def blocking_lock(key, timeout: DEFAULT_TIMEOUT, limit: 1, fair: fair?, &block)
      key, ttl, limit = lock_arguments(key, timeout, limit, block)
      _, value = synchronize(key, ttl, ttl / 1000.0, limit, Arguments.boolean(fair, :fair), &block)
      value
    end

    # @return [Lock, nil] nil when someone else holds the lock
    def try_lock(key, timeout: DEFAULT_TIMEOUT)
      key = Arguments.key(key).dup.freeze # the Lock keeps it: the caller may change theirs
      token = native_try_acquire(key, Arguments.milliseconds(timeout, :timeout))
      token && Lock.new(self, key, token)
    end

    # @return [Lock]
    # @raise [LockNotAcquired] when the lock stays held for `timeout` seconds
    def lock(key, timeout: DEFAULT_TIMEOUT, fair: fair?)
      key = Arguments.key(key).dup.freeze # the Lock keeps it: the caller may change theirs
      ttl = Arguments.milliseconds(timeout, :timeout)
      Lock.new(self, key, native_acquire(key, ttl, ttl / 1000.0, Arguments.boolean(fair, :fair)))
    end

    # @return [Boolean] whether blocking waits are fair unless told otherwise
    def fair?
      @settings[:fair]
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

    # Runs the block under the lock; a lock lost meanwhile is reported as on_lost says.
    # @return [Array(Boolean, Object)] nil (not acquired), true (released) or false (lost), and
    #   the block's value
    def synchronize(key, ttl, wait, limit, fair)
      value = started = nil
      held = native_synchronize(key, ttl, wait, limit, fair) do
        started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
        value = yield
      end
      lost(key, ttl, started, value) if held == false
      [held, value]
    end

    def lost(key, ttl, started, value)
      ran_for = Process.clock_gettime(Process::CLOCK_MONOTONIC) - started
      error = LockLost.new(key, value: value, ran_for: ran_for, timeout: ttl / 1000.0)
      raise error if @settings[:on_lost] == :raise

      LockManager.logger&.warn(error.message)
    end

    # @return [Array] the key, the TTL in ms, the limit
    def lock_arguments(key, timeout, limit, block)
      raise ArgumentError, "a block is required" unless block

      [Arguments.key(key), Arguments.milliseconds(timeout, :timeout), Arguments.positive_integer(limit, :limit)]
    end
  end
end
