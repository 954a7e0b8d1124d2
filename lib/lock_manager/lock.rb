# frozen_string_literal: true

module LockManager
  # A held lock, as returned by Locker#try_lock and Locker#lock. Its token is the UUID this
  # acquisition wrote: every call below acts only while that token still holds the key.
  class Lock
    attr_reader :key

    # @api private: Locker#try_lock and Locker#lock build it around the lock the extension took
    def initialize(key, native)
      @key = key
      @native = native
    end

    # @return [String] the UUID that holds the key
    def token
      @native.token
    end

    # @return [Integer] grows with every acquisition of the key (see the README's fencing tokens)
    def fencing_token
      @native.fencing_token
    end

    # @return [Boolean] asks Redis whether this token still holds the key
    def owned?
      @native.owned?
    end

    # @return [Boolean] true once the renewal (renew: true), or the one extension of a lock a
    #   release handed over, found the lock lost; otherwise nothing watches the lock: ask #owned?
    def lost?
      @native.lost?
    end

    # Resets the lock's validity to `seconds` from now (a pending extension of a lock handed over
    # is dropped: it would overwrite this).
    # @return [Boolean] false when the lock expired or changed hands
    def refresh(seconds)
      @native.refresh(Arguments.milliseconds(seconds, :seconds))
    end

    # Stops the renewal, if any, and deletes the lock.
    # @return [Boolean] true if this token still held the lock and deleted it
    def release
      @native.release
    end

    def inspect
      "#<#{self.class} key=#{@key.inspect} token=#{token} fencing_token=#{fencing_token}>"
    end
  end
end
