# frozen_string_literal: true

module LockManager
  module Testing
    # The fake's locks: the Keyspace, the Queues of threads waiting for keys, and the Registry of
    # threads' plain locks. One mutex guards keys and queues; every change wakes the waiters (a
    # ConditionVariable), and a holder's expiry is waited out by a timed wait: nothing polls.
    class Store
      # The Hold taken (nil: not taken), and whether the first attempt found the key held.
      Acquired = Struct.new(:hold, :contended)

      attr_reader :registry

      def initialize(fencing)
        @mutex = Mutex.new
        @changed = ConditionVariable.new
        @keyspace = Keyspace.new(fencing)
        @queues = Queues.new(@keyspace, @mutex, @changed)
        @registry = Registry.new
      end

      # Forgets every lock and every thread's record of holding one; waiting threads stay queued.
      def reset!
        @registry.clear
        changing { @keyspace.clear }
      end

      # One attempt (request.wait nil), or a wait of up to request.wait seconds.
      # @return [Acquired]
      # @raise [LockNotAcquired] when the wait ran out (naming `key` as the caller gave it)
      # @raise [AlreadyHeld] when this thread holds the plain lock `key`
      def acquire(key, token, request)
        name = key
        key = key.b # Redis compares a key's bytes, whatever its encoding
        @registry.check_not_held(key, name) unless request.shared?
        @mutex.synchronize do
          hold = @queues.take(key, token, request)
          return Acquired.new(hold, false) if hold
          return Acquired.new(nil, true) unless request.wait

          Acquired.new(@queues.wait(key, name, token, request), true)
        end
      end

      # @return [Boolean] whether `token` holds `key` now
      def holds?(key, token)
        @mutex.synchronize { !@keyspace.find(key.b, token).nil? }
      end

      # Takes `key` for `token` unless another token holds it, ahead of any queue (as claim.lua
      # does); a renewed request (adopt) is renewed from now on.
      # @return [Integer, String] the fencing token, or the holder's token
      def claim(key, token, request)
        changing { @keyspace.claim(key.b, token, request) }
      end

      # Resets the expiry of `token`'s hold on `key` to `seconds` from now (never shorter, while renewed).
      # @return [Boolean] false when the token no longer holds the key
      def refresh(key, token, seconds)
        changing do
          hold = @keyspace.find(key.b, token) or next false

          @keyspace.extend_to(hold, Keyspace.clock + seconds)
          true
        end
      end

      # Ends the renewal of `token`'s hold: it lives out one more TTL at most, as a renewed lock
      # does in Redis.
      def stop_lease(key, token, ttl)
        changing do
          hold = @keyspace.find(key.b, token) or next

          hold.leased = false
          hold.expires_at = [hold.expires_at, Keyspace.clock + ttl].min
        end
      end

      # Deletes `token`'s hold on `key`, handing the freed place to the first waiter.
      # @return [Boolean] whether the token held the key
      def release(key, token)
        key = key.b
        changing do
          hold = @keyspace.find(key, token) or next false

          @keyspace.delete(key, hold)
          @queues.hand_over(key)
          true
        end
      end

      # @return [String, nil] the token that holds the plain lock `key`
      def holder(key)
        @mutex.synchronize do
          holds = @keyspace.live(key.b)
          holds.first.token if holds.size == 1 && holds.first.limit == 1
        end
      end

      def locked?(key)
        @mutex.synchronize { !@keyspace.live(key.b).empty? }
      end

      private

      # Runs a change under the mutex, then wakes every waiter to look again.
      def changing
        @mutex.synchronize do
          yield
        ensure
          @changed.broadcast
        end
      end
    end
  end
end
