# frozen_string_literal: true

module LockManager
  # A held lock, as returned by Locker#try_lock and Locker#lock. Its token is the UUID this
  # acquisition wrote: every call below acts only while that token still holds the key.
  class Lock
    attr_reader :key, :token, :fencing_token

    # @param lease [Lease, nil] the renewal (renewed: true), or the one extension of a lock a
    #   release handed over
    def initialize(locker, key, token, fencing_token: nil, lease: nil, renewed: false)
      @locker = locker
      @key = key
      @token = token
      @fencing_token = fencing_token
      @lease = lease
      @renewed = renewed
    end

    # @return [Boolean] asks Redis whether this token still holds the key
    def owned?
      @locker.send(:native_owned, @key, @token)
    end

    # @return [Boolean] true once the renewal (renew: true), or the one extension of a lock a
    #   release handed over, found the lock lost; otherwise nothing watches the lock: ask #owned?
    def lost?
      @lease&.lost? || false
    end

    # Resets the lock's validity to `seconds` from now (a pending extension of a lock handed over
    # is dropped: it would overwrite this).
    # @return [Boolean] false when the lock expired or changed hands
    def refresh(seconds)
      ttl = Arguments.milliseconds(seconds, :seconds)
      @lease&.stop unless @renewed
      @locker.send(:native_refresh, @key, @token, ttl)
    end

    # Stops the renewal, if any, and deletes the lock.
    # @return [Boolean] true if this token still held the lock and deleted it
    def release
      @lease&.stop
      @locker.send(:native_release, @key, @token)
    end

    def inspect
      "#<#{self.class} key=#{@key.inspect} token=#{@token} fencing_token=#{@fencing_token}>"
    end
  end
end
