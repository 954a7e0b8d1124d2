# frozen_string_literal: true

module LockManager
  # A held lock, as returned by Locker#try_lock and Locker#lock. Its token is the one this
  # acquisition wrote: every call below acts only while that token still holds the key.
  class Lock
    attr_reader :key

    # @api private: Locker#try_lock and Locker#lock build it around the lock the extension took
    def initialize(key, native)
      @key = key
      @native = native
      @acquired_at = Instrumentation.clock
    end

    # @return [String] the token that holds the key: who took it (host/pid/thread), when, and a random part
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

    # @return [Boolean] true once the renewal (renew: true) found the lock lost; otherwise
    #   nothing watches the lock: ask #owned?
    def lost?
      @native.lost?
    end

    # Resets the lock's validity to `seconds` from now.
    # @return [Boolean] false when the lock expired or changed hands
    def refresh(seconds)
      refreshed = @native.refresh(Arguments.milliseconds(seconds, :seconds))
      Instrumentation.renewed(key, seconds, refreshed)
      refreshed
    end

    # Stops the renewal and leaves the lock in Redis for `seconds` more, for another process to
    # take over by its token (a unique job waiting for its retry); this thread no longer holds it.
    # @return [Boolean] false when the lock expired or changed hands
    def keep(seconds)
      kept = @native.keep(Arguments.milliseconds(seconds, :seconds))
      Instrumentation.renewed(key, seconds, kept)
      kept
    end

    # Stops the renewal, if any, and deletes the lock.
    # @return [Boolean] true if this token still held the lock and deleted it
    def release
      released = @native.release
      Instrumentation.released(key, released) { Instrumentation.clock - @acquired_at }
      released
    end

    # #release, but a lock no waiter is queued for goes to the first job parked on it
    # (Claims#park): the lock of a job with on_conflict: :park.
    # @api private
    def release_parked
      released = @native.release_parked
      Instrumentation.released(key, released) { Instrumentation.clock - @acquired_at }
      released
    end

    def inspect
      "#<#{self.class} key=#{@key.inspect} token=#{token} fencing_token=#{fencing_token}>"
    end
  end
end
