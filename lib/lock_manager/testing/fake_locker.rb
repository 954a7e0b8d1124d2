# frozen_string_literal: true

module LockManager
  module Testing
    # The backend of every Locker under `LockManager::Testing.fake!`: the calls of Native::Locker,
    # with the same arguments, return values and errors, on the in-process Store (whose keys are
    # the callers' keys: key_prefix plays no part).
    class FakeLocker
      include Unconnected
      def initialize(store)
        @store = store
      end

      # Yields the fencing token, the lock when it is renewed (else nil), and whether the first
      # attempt found the key held; releases it after the block.
      # @return [nil, Boolean] nil when taken by another; else whether the lock was held to the end
      def synchronize(key, ttl_ms, wait, limit, fair, renewal) # rubocop:disable Metrics/ParameterLists -- Native's
        lock, contended = acquire(key, Request.new(ttl_ms, wait, limit, fair, renewal))
        return unless lock

        begin
          yield lock.fencing_token, (lock if renewal), contended
        ensure
          held = lock.finish
        end
        held
      end

      # @return [FakeLock, nil] nil when taken (and `wait` nil)
      # @raise [LockNotAcquired] when a wait ran out
      def lock(key, ttl_ms, wait, fair, renewal)
        acquire(key, Request.new(ttl_ms, wait, 1, fair, renewal)).first
      end

      def locked?(key)
        @store.locked?(key)
      end

      def limiter(name, kind, count, per, burst)
        FakeLimiter.new(name, kind, count, per, burst)
      end

      # @return [Array<Integer, String>] per key: the fencing token when claimed, else the holder's token
      def claim(keys, tokens, ttls_ms)
        unless keys.size == tokens.size && keys.size == ttls_ms.size
          raise ArgumentError, "claim: as many tokens and TTLs as keys"
        end

        keys.each_with_index.map do |key, at|
          @store.claim(key, tokens[at], Request.new(ttls_ms[at], nil, 1, false, false))
        end
      end

      # @return [FakeLock, String, nil] the claim taken over (or the free key taken), else the holder's
      #   token; with limit > 1, a free permit taken, else nil (no job parks here)
      def adopt(key, token, ttl_ms, limit, renewal)
        request = Request.new(ttl_ms, nil, limit, false, renewal)
        if limit > 1
          hold = @store.acquire(key, token, request).hold
          return hold && FakeLock.new(@store, key, token, hold.fencing_token, request)
        end

        @store.registry.check_not_held(key.b, key)
        claimed = @store.claim(key, token, request)
        claimed.is_a?(Integer) ? FakeLock.new(@store, key, token, claimed, request) : claimed
      end

      def holder(key)
        @store.holder(key)
      end

      def release_claim(key, token)
        @store.release(key, token)
      end

      def release_claims(keys, tokens)
        keys.zip(tokens).map { |key, token| release_claim(key, token) }
      end

      private

      def acquire(key, request)
        token = Testing.token(request.limit)
        acquired = @store.acquire(key, token, request)
        return [nil, acquired.contended] unless acquired.hold

        [FakeLock.new(@store, key, token, acquired.hold.fencing_token, request), acquired.contended]
      end
    end
  end
end
