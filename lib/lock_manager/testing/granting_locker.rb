# frozen_string_literal: true

module LockManager
  module Testing
    # A lock that was granted without being kept anywhere: it is owned until released, and never lost.
    class GrantedLock
      attr_reader :token, :fencing_token

      def initialize(token, fencing_token)
        @token = token
        @fencing_token = fencing_token
      end

      def lost?
        false
      end

      def owned?
        true
      end

      def refresh(_ttl_ms)
        true
      end

      def keep(_ttl_ms)
        true
      end

      def release
        true
      end
      alias release_parked release
    end

    # A limiter under `LockManager::Testing.disable!`: admits every call.
    GrantingLimiter = Struct.new(:amount) do
      def decide(_cost, _wait, _promise = nil)
        [true, amount, 0.0, 0.0, [0, 0]]
      end

      def give_back(_cost, _receipt); end

      def reset
        false
      end
    end

    # The backend of every Locker under `LockManager::Testing.disable!`: every lock and claim is
    # granted at once, with a fencing token that grows as the real ones do; nothing is ever held.
    class GrantingLocker
      include Unconnected
      def initialize(fencing)
        @fencing = fencing
      end

      def synchronize(_key, _ttl_ms, _wait, limit, _fair, renewal) # rubocop:disable Metrics/ParameterLists -- Native's
        lock = GrantedLock.new(Testing.token(limit), @fencing.next)
        yield lock.fencing_token, (lock if renewal), false
        true
      end

      def lock(_key, _ttl_ms, _wait, _fair, _renewal)
        GrantedLock.new(Testing.token(1), @fencing.next)
      end

      def locked?(_key)
        false
      end

      def limiter(_name, _kind, amount, _per, _burst)
        GrantingLimiter.new(amount)
      end

      def claim(keys, tokens, ttls_ms)
        unless keys.size == tokens.size && keys.size == ttls_ms.size
          raise ArgumentError, "claim: as many tokens and TTLs as keys"
        end

        keys.map { @fencing.next }
      end

      def adopt(_key, token, _ttl_ms, _limit, _renewal)
        GrantedLock.new(token, @fencing.next)
      end

      def holder(_key)
        nil
      end

      def release_claim(_key, _token)
        true
      end

      def release_claims(keys, _tokens)
        keys.map { true }
      end
    end
  end
end
