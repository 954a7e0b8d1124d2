# frozen_string_literal: true

module LockManager
  module Testing
    # A lock held in the fake keyspace: what LockManager::Lock (and a renewed block's Result) holds
    # in place of a Native::Lock, answering the same calls. Its renewal is modelled by the hold's
    # expiry (none, or max_hold), so `lost?` turns true as soon as the lock is gone.
    class FakeLock
      attr_reader :token, :fencing_token

      def initialize(store, key, token, fencing_token, request)
        @store = store
        @key = key
        @token = token
        @fencing_token = fencing_token
        @request = request
        @pid = Process.pid
        @leased = request.renewed?
        @lost = false
        @registered = store.registry.add(key.b, request) unless request.shared?
      end

      # True once the lock, renewed, is found gone; a lock that is not renewed is not watched.
      def lost?
        @leased ? !@store.holds?(@key, @token) : @lost
      end

      def owned?
        here? && @store.holds?(@key, @token)
      end

      def refresh(ttl_ms)
        return false unless here?

        refreshed = @store.refresh(@key, @token, ttl_ms / 1000.0)
        @store.registry.held_until(@registered, ttl_ms / 1000.0) if refreshed && @registered && !@leased
        refreshed
      end

      def keep(ttl_ms)
        return false unless here?

        let_go
        @store.refresh(@key, @token, ttl_ms / 1000.0)
      end

      def release
        return false unless here?

        let_go
        @store.release(@key, @token)
      end

      # No job parks in the fake (on_conflict: :park reschedules there): nothing to hand on.
      alias release_parked release

      # The release after a block: whether the lock was held to its end. A child forked inside the
      # block leaves its parent's lock alone.
      # @api private
      def finish
        return true unless here?

        release && !@lost
      end

      private

      def here?
        @pid == Process.pid
      end

      # Stops the renewal (`lost?` keeps what it was) and forgets this thread's hold.
      def let_go
        if @leased
          @lost = lost?
          @leased = false
          @store.stop_lease(@key, @token, @request.ttl)
        end
        @store.registry.delete(@registered) if @registered
      end
    end
  end
end
