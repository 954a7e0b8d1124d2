# frozen_string_literal: true

require_relative "../lock_manager"
require_relative "testing/request"
require_relative "testing/unconnected"
require_relative "testing/keyspace"
require_relative "testing/registry"
require_relative "testing/queues"
require_relative "testing/store"
require_relative "testing/fake_lock"
require_relative "testing/fake_locker"
require_relative "testing/granting_locker"
require_relative "testing/fake_limiter"
require_relative "testing/recorder"

module LockManager
  # Locks in an app's tests, without Redis:
  #
  #   LockManager::Testing.fake!    # in-process locks with the real semantics (exclusion, TTL, limit...)
  #   LockManager::Testing.disable! # every lock granted at once
  #   LockManager::Testing.real!    # Redis again
  #   LockManager::Testing.fake { ... } # for the block only, then the mode before it
  #
  # Every Locker follows the mode, the shared one and those of Locker.new, built before or after.
  # See docs/testing.md, and lock_manager/testing/rspec and lock_manager/testing/minitest.
  module Testing
    # Fencing tokens of the fake and disabled modes: one counter per process, started at the clock
    # in microseconds as the real counter is, so they only grow, for every key.
    class Fencing
      def initialize
        @mutex = Mutex.new
        @last = Process.clock_gettime(Process::CLOCK_REALTIME, :microsecond)
      end

      def next
        @mutex.synchronize { @last += 1 }
      end
    end

    @fencing = Fencing.new
    @store = Store.new(@fencing)
    @fake = FakeLocker.new(@store)
    @granting = GrantingLocker.new(@fencing)
    @travelled = 0

    class << self
      # Every Locker uses the in-process locks from now on.
      # @return [Symbol] :fake
      def fake!
        LockManager.testing_backend = @fake
        mode
      end

      # Every lock is granted at once from now on (no exclusion).
      # @return [Symbol] :disabled
      def disable!
        LockManager.testing_backend = @granting
        mode
      end

      # Every Locker uses Redis again.
      # @return [Symbol] :real
      def real!
        LockManager.testing_backend = nil
        mode
      end

      # Runs the block in fake mode, then restores the mode before it (also when the block raises).
      # @return the block's value
      def fake(&block)
        within(@fake, &block)
      end

      # Runs the block with every lock granted, then restores the mode before it.
      # @return the block's value
      def disable(&block)
        within(@granting, &block)
      end

      # Runs the block on Redis, then restores the mode before it.
      # @return the block's value
      def real(&block)
        within(nil, &block)
      end

      # @return [Symbol] :real, :fake or :disabled
      def mode
        case LockManager.testing_backend
        when nil then :real
        when @fake then :fake
        when @granting then :disabled
        else :custom
        end
      end

      # Forgets every fake lock (for a `before` hook): their holders find them lost (a renewed one at
      # once, others when they release); threads that wait for a key go on waiting for it.
      def reset!
        @store.reset!
        FakeLimiter.reset!
        @travelled = 0
        nil
      end

      # Moves the clock of the fake limiters `seconds` ahead (their windows pass, their rates
      # refill), as if that much time had gone by.
      # @return [Float] seconds travelled in all since the last reset!
      def travel(seconds)
        @travelled += Arguments.seconds(seconds, :seconds)
      end

      # Microseconds on the fake limiters' clock: the real time, plus any travel.
      # @api private
      def now_us
        Process.clock_gettime(Process::CLOCK_REALTIME, :microsecond) + (@travelled * 1_000_000).round
      end

      # A token as the extension writes it (`<host>/<pid>/<thread>/<since ms>/<random>`, and `/<limit>` for a
      # semaphore's): the core makes it, so code that reads holders finds the same fields.
      # @api private
      def token(limit)
        Native.new_token(limit)
      end

      # `"key"` as the extension's messages quote it (the core quotes it).
      # @api private
      def quote(key)
        Native.quote_key(key.to_s)
      end

      private

      def within(backend)
        raise ArgumentError, "a block is required" unless block_given?

        previous = LockManager.testing_backend
        LockManager.testing_backend = backend
        begin
          yield
        ensure
          LockManager.testing_backend = previous
        end
      end
    end
  end
end
