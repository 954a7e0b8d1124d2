# frozen_string_literal: true

module LockManager
  # A Locker's claims: locks held by a token the caller names (a job's id) rather than by a
  # thread, taken in bulk, handed between processes, read back. What the job integrations build
  # their uniqueness on (see JobLock).
  module Claims
    # Takes each key for its token (a job's id) for its number of seconds, unless another token
    # holds it; a key its token holds already gets the new TTL. One round trip on one Redis (one per
    # key on a Cluster). The job integrations' enqueue locks; see also #adopt and #release_claim.
    # @return [Array<Integer, String>] per key: the fencing token when claimed, else the holder's token
    def claim(keys, tokens, seconds)
      keys = keys.map { |key| Arguments.key(key) }
      started = Instrumentation.started
      replies = native.claim(keys, tokens.map { |token| Arguments.string(token, :token) },
                             seconds.map { |value| Arguments.milliseconds(value, :unique_for) })
      keys.zip(replies) { |key, reply| Instrumentation.claimed(key, started, :claim, reply) } if started
      replies
    end

    # Takes over the lock `token` claimed on `key` (or takes it, when free) for this thread: it
    # lives `timeout` seconds and is renewed until released or kept (Lock#keep).
    # @return [Lock, String, nil] the lock, or the token of whoever holds it instead
    def adopt(key, token, timeout: Locker::DEFAULT_TIMEOUT, max_hold: nil)
      key = Arguments.key(key).dup.freeze
      started = Instrumentation.started
      lock = native.adopt(key, Arguments.string(token, :token), Arguments.milliseconds(timeout, :timeout),
                          renewal(true, max_hold))
      Instrumentation.claimed(key, started, :adopt, lock) if started
      LeaseEvents.watch
      lock.is_a?(String) || lock.nil? ? lock : Lock.new(key, lock)
    end

    # @return [String, nil] the token that holds the key (for a job's lock: its jid), or nil
    def holder(key)
      native.holder(Arguments.key(key))
    end

    # Deletes the lock if `token` holds it (a lock claimed for a job that will not run).
    # @return [Boolean] whether it did
    def release_claim(key, token)
      native.release_claim(Arguments.key(key), Arguments.string(token, :token))
    end
  end
end
