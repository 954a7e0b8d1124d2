# frozen_string_literal: true

module LockManager
  # A Locker's claims: locks held by a token the caller names (a job's id) rather than by a
  # thread, taken in bulk, handed between processes, read back. What the job integrations build
  # their uniqueness on (see JobLock).
  module Claims
    # Takes each key for its token (a job's id) for its number of seconds, unless another token
    # holds it; a key its token holds already gets the new TTL. One round trip on one Redis (one per
    # key on a Cluster). The job integrations' enqueue locks; see also #adopt and #release_claim.
    # With `pushes:` (per key, a job's push commands, each [name, key, *args], from Sidekiq's own
    # push), a claim taken also runs its push, in the same round trip, on a Redis that is the jobs'
    # too (#server_identity): a job is pushed with its lock or not at all.
    # With `replacing:` too (per key, true for a job with on_conflict: :replace), a claim whose key
    # another job holds while that job is still pending takes the key over and takes that job's push
    # out of its queue or schedule, in the same script: that job will not run.
    # @return [Array<Integer, String, Array>] per key: the fencing token when claimed, [the fencing
    #   token, the replaced job's token] when it replaced a pending job, else the holder's token
    def claim(keys, tokens, seconds, pushes: nil, replacing: nil)
      keys = keys.map { |key| Arguments.key(key) }
      started = Instrumentation.started
      replies = claimed(keys, tokens.map { |token| Arguments.string(token, :token) },
                        seconds.map { |value| Arguments.milliseconds(value, :unique_for) }, pushes, replacing)
      keys.zip(replies) { |key, reply| Instrumentation.claimed(key, started, :claim, reply) } if started
      replies
    end

    # Takes over the lock `token` claimed on `key` (or takes it, when free) for this thread: it
    # lives `timeout` seconds and is renewed until released or kept (Lock#keep). With `limit` > 1,
    # a permit of the semaphore `key`: the one a release handed to `token` (#park), or a free one.
    # @return [Lock, String, nil] the lock, or the token of whoever holds it instead (nil: a
    #   semaphore's permits are all taken)
    def adopt(key, token, timeout: Locker::DEFAULT_TIMEOUT, max_hold: nil, limit: 1)
      key = Arguments.key(key).dup.freeze
      started = Instrumentation.started
      lock = native.adopt(key, Arguments.string(token, :token), Arguments.milliseconds(timeout, :timeout),
                          Arguments.positive_integer(limit, :limit), renewal(true, max_hold))
      Instrumentation.claimed(key, started, :adopt, lock) if started
      LeaseEvents.watch
      lock.is_a?(String) || lock.nil? ? lock : Lock.new(key, lock)
    end

    # The Redis the locks live on, "run_id/db" (INFO's run_id, the connection's database), or nil on
    # a Cluster or a Redis older than 6.2: where a client of the same Redis says the same, a
    # claim may carry its job's push (#claim with pushes:).
    def server_identity
      native.server_identity
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

    # #release_claim of each key for its token (the claims of jobs removed in bulk): one round trip
    # on one Redis (one per key on a Cluster).
    # @return [Array<Boolean>] per key: whether it was released
    def release_claims(keys, tokens)
      raise ArgumentError, "release_claims: as many tokens as keys" unless keys.size == tokens.size

      native.release_claims(keys.map { |key| Arguments.key(key) },
                            tokens.map { |token| Arguments.string(token, :token) })
    end

    # Parks a job on `key` (held by another; with `limit` > 1, a semaphore whose permits are all
    # taken): it waits in Redis for a release, which hands the lock (a permit) to it (for `ttl`
    # seconds, until it takes it over by `token` with #adopt) and runs its `push` (Sidekiq's
    # commands for it, each [name, key, *args]). When no release comes, the `fallback` member of
    # Sidekiq's `schedule` is due `grace` seconds after the lock would have room. For a Redis that
    # is also the jobs' (#server_identity). The job integrations' on_conflict: :park (and a
    # concurrency rule's on_limit: :park).
    # @param most [Integer, nil] how many jobs may be parked on the key at most
    # @return [Array(Symbol, Integer)] [:parked, place in line], [:full, how many are parked], or
    #   [:handed, 0]: the lock had room and went to the first parked job at once
    # @api private
    def park(key, token, ttl:, grace:, most:, schedule:, fallback:, push:, limit: 1)
      native.park(Arguments.key(key), parked_token(token), Arguments.milliseconds(ttl, :ttl),
                  Arguments.milliseconds(grace, :grace), most || 0, Arguments.positive_integer(limit, :limit),
                  schedule, fallback, push)
    end

    # The fallback of `key`'s parked jobs (#park): a free lock goes to the first of them.
    # @return [String, nil] the token it went to
    # @api private
    def unpark(key)
      native.unpark(Arguments.key(key))
    end

    # @return [Integer] how many jobs are parked on `key`
    def parked_count(key)
      native.parked_count(Arguments.key(key))
    end

    private

    # A parked job's token is found in its line by its JSON text (ext/lock_manager/src/parking.rs):
    # one that JSON escapes could not be (a job's id never is).
    def parked_token(token)
      token = Arguments.string(token, :token)
      return token unless token.match?(%r{["\\/[:cntrl:]]})

      raise ArgumentError, "park: token must have no quote, backslash, slash or control character, got #{token.inspect}"
    end

    def claimed(keys, tokens, ttls, pushes, replacing)
      return native.claim(keys, tokens, ttls) unless pushes

      native.claim_push(keys, tokens, ttls, pushes, replacing)
    end
  end
end
