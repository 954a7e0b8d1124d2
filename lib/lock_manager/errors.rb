# frozen_string_literal: true

module LockManager
  # Base class of every error the gem raises on its own.
  class Error < StandardError; end

  # The lock stayed held by someone else for the whole wait.
  class LockNotAcquired < Error
    attr_reader :key, :waited

    # @param key [String] the key as the caller gave it (without the prefix)
    # @param waited [Float, nil] seconds spent waiting
    def initialize(key = nil, waited = nil)
      @key = key
      @waited = waited
      super(if waited
              "lock #{key.inspect} is held by another owner; gave up after #{format("%.3f", waited)}s"
            else
              "lock #{key.inspect} is held by another owner"
            end)
    end
  end

  # A Limiter did not admit the call: `retry_after` seconds from now it would have (nil for a
  # concurrency limiter, which frees a place when a holder leaves).
  class OverLimit < Error
    attr_reader :limiter, :retry_after

    # @param limiter [String] the limiter's name
    def initialize(limiter = nil, retry_after = nil, rule = nil)
      @limiter = limiter
      @retry_after = retry_after
      retry_in = retry_after ? "; retry after #{format("%.3f", retry_after)}s" : ""
      super("limiter #{limiter.inspect} is over its limit (#{rule})#{retry_in}")
    end
  end

  # The calling thread already holds this plain lock through this Locker: waiting would wait for
  # itself. (A `limit: N` semaphore may be taken twice: each acquisition is a permit.)
  class AlreadyHeld < Error; end

  # Redis is unreachable or reset the connection.
  class ConnectionError < Error; end

  # Redis did not answer within read_timeout. Whether the command ran is unknown: an acquire
  # that timed out is undone (compare-and-delete with its token) before this is raised.
  class TimeoutError < ConnectionError; end

  # Redis answered as a replica, not the primary (READONLY), or as a replica that lost its primary
  # (MASTERDOWN): redis_url names the wrong server, or a failover is under way.
  class ReadOnlyError < ConnectionError; end

  # Redis is loading its data set after a restart (LOADING).
  class LoadingError < ConnectionError; end

  # The Redis Cluster cannot serve the key's slot now (CLUSTERDOWN, TRYAGAIN).
  class ClusterDownError < ConnectionError; end

  # Redis has as many clients as its maxclients allows.
  class TooManyClientsError < ConnectionError; end

  # The TLS handshake failed: the server's certificate is not trusted (tls_ca_file), is for
  # another name or has expired, or the server refused the client's certificate (tls_cert_file).
  # The message says which, and where. Not retried: a blocking wait ends at once.
  class TLSError < ConnectionError; end

  # redis_url names a Redis Cluster node (MOVED, ASK, CROSSSLOT).
  class ClusterError < Error; end

  # Redis refused the credentials of redis_url (WRONGPASS, NOAUTH). Not retried.
  class AuthenticationError < Error; end

  # The Redis user of redis_url may not run the lock's commands on its keys (NOPERM).
  class PermissionError < Error; end

  # Redis is out of memory and refuses writes (OOM, with maxmemory and noeviction).
  class OutOfMemoryError < Error; end

  # The lock expired while its block ran (it outlived `timeout`, or its renewal stopped or failed)
  # and may have been taken by another holder: the block did run, without exclusion for part of
  # the time. Raised after the block when on_lost is :raise.
  class LockLost < Error
    attr_reader :key, :value, :ran_for

    # @param value the block's value
    # @param ran_for [Float] seconds the block ran
    # @param max_hold [Float, nil] the renewal's cap, for a lock taken with renew: true
    def initialize(key = nil, value: nil, ran_for: nil, timeout: nil, renewed: false, max_hold: nil)
      @key = key
      @value = value
      @ran_for = ran_for
      super("lock #{key.inspect} was lost while its block ran: the block ran #{format("%.3f", ran_for.to_f)}s, " \
            "#{why(timeout, renewed, max_hold)}")
    end

    private

    def why(timeout, renewed, max_hold)
      return expired_or_gone(timeout) unless renewed
      if max_hold && ran_for.to_f >= max_hold
        return "longer than max_hold (#{max_hold}s): renewal stopped and the lock expired"
      end

      "and a renewal found the lock expired or held by another (Redis unreachable for its timeout of " \
        "#{timeout}s, or the key changed)"
    end

    # A block that ended within the timeout lost its lock to Redis, not to the clock.
    def expired_or_gone(timeout)
      if timeout && ran_for.to_f < timeout
        return "within its timeout of #{timeout}s, but the lock was gone when released (Redis lost it: a restart " \
               "or failover, eviction, or the key deleted)"
      end

      "longer than its timeout of #{timeout}s, and the lock had expired when released"
    end
  end

  # Fewer than min_replicas replicas acknowledged an acquisition within replica_timeout: the lock
  # was released again and not granted (a blocking wait keeps trying until its deadline).
  class NotReplicated < Error; end

  # No pooled connection became free within pool_timeout.
  class PoolTimeout < Error; end
end
