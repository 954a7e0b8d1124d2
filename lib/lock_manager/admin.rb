# frozen_string_literal: true

require_relative "../lock_manager"

module LockManager
  # What operators see of the locks, and what they can do about a stuck one: built from Redis's
  # keyspace alone (SCAN on every master, never KEYS), never from any process's memory, and
  # costing the lock cycle nothing. See docs/admin.md.
  #
  #   admin = LockManager::Admin.new                # the shared Locker's Redis and key_prefix
  #   admin.locks("report:*").each { |lock| puts lock.key, lock.holders.first&.host }
  #   admin.lock("report")                          # => LockInfo, or nil
  #   admin.release("report")                       # => true: its holders lost it, its waiters retry
  #   admin.parked("report")                        # => [ParkedJob], the jobs parked on it, in line
  #   admin.delete_parked("report", jid)            # => true: that parked job will not run
  #   admin.limiters("exports:*")                   # => [LimiterInfo], the rate limiters in use
  #   admin.reset_limiter("exports:42")             # => true: it admits its whole rule again
  class Admin
    # A lock: its key (without key_prefix); limit: the N of a `limit: N` semaphore, nil for a plain
    # lock; holders and waiters (queued, in arrival order); parked: how many jobs are parked on it
    # (on_conflict: :park; #parked lists them).
    LockInfo = Struct.new(:key, :limit, :holders, :waiters, :parked, keyword_init: true)
    # A holder: its token; for a job's lock (a claim) the job's id as jid, otherwise host, pid and
    # thread (Thread#native_thread_id) of the acquiring thread, and since: when it asked for the
    # lock (its machine's clock). ttl: seconds left (nil: no expiry). fencing_token: always nil
    # (Redis does not keep it with the lock; see docs/admin.md).
    Holder = Struct.new(:token, :jid, :host, :pid, :thread, :since, :ttl, :fencing_token, keyword_init: true)
    # A queued waiter, in arrival order; since: when it queued (Redis's clock).
    Waiter = Struct.new(:token, :host, :pid, :thread, :since, keyword_init: true)

    DEFAULT_LIMIT = 1000

    attr_reader :locker

    # @param locker [Locker] whose Redis (topology, pool) and key_prefix to look at
    def initialize(locker = LockManager.locker)
      raise ArgumentError, "locker must be a LockManager::Locker, got #{locker.inspect}" unless locker.is_a?(Locker)

      @locker = locker
    end

    # The locks whose keys match `pattern`, sorted by key: SCAN finds the keys (a round trip per
    # 1,000 keys and master), then their holders, waiters and parked jobs' count are read in
    # pipelines of 1,000. SCAN finds a lock by its own key: one that expired with jobs still parked
    # on it (its holder died; their fallback moves them soon) is not listed, but #lock shows it.
    # @param pattern [String] a Redis glob over keys without key_prefix ("report:*", "user:?")
    # @param limit [Integer, nil] the first `limit` keys in sort order (nil: all)
    # @return [Array<LockInfo>]
    def locks(pattern = "*", limit: DEFAULT_LIMIT)
      keys = keys(pattern)
      keys = keys.first(Arguments.positive_integer(limit, :limit)) if limit
      return [] if keys.empty?

      native.admin_locks(keys, pattern).filter_map { |raw| raw && info(raw) }
    end

    # Every lock whose key matches `pattern`, as found: batch by batch, in no order, each key once.
    # @yieldparam lock [LockInfo]
    # @return [Enumerator] without a block
    def each_lock(pattern = "*", &block)
      return enum_for(:each_lock, pattern) unless block

      scan = native.admin_scan(Arguments.key(pattern, :pattern), true)
      while (batch = scan.next_batch)
        batch.each { |raw| yield info(raw) }
      end
      self
    end

    # The keys (without key_prefix) matching `pattern`, sorted; SCAN only, no lock is read.
    # @return [Array<String>]
    def keys(pattern = "*")
      scan = native.admin_scan(Arguments.key(pattern, :pattern), false)
      keys = []
      while (batch = scan.next_batch)
        keys.concat(batch)
      end
      keys.sort!
    end

    # @return [LockInfo, nil] nil when nobody holds `key`, waits for it or is parked on it
    def lock(key)
      raw = native.admin_locks([Arguments.key(key)], nil).first
      raw && info(raw)
    end

    # Force-releases `key`: removes its holders (the plain lock's token, every permit of a
    # semaphore) and wakes its waiters in every process, which then take it in queue order. A
    # holder finds out at its next renewal (Result#lost?, `lock.lost?`), refresh or release.
    # The first job parked on it (#parked), if any, takes it at once and is pushed to its queue; so
    # it does on a lock that expired with jobs parked on it (its holder died, no release came).
    # Nothing else is touched: not the queue, not another key.
    # @return [Boolean] true if a lock was removed, or handed to a parked job
    def release(key)
      native.admin_release(Arguments.key(key))
    end

    # Force-releases the lock a job of `job_class` (a Sidekiq or ActiveJob class with lock_with)
    # would take with `args` (and its run lock, for :until_and_while_executing), as #release
    # does: a pending job's, a running one's, or one left by a job deleted some other way.
    # @return [Boolean] whether there was one
    # @raise [ArgumentError] for a class without lock_with
    def release_job(job_class, args)
      lock = job_lock(job_class, args)
      keys = [lock.key]
      keys << (lock.key + JobLock::RUN_SUFFIX) if lock.options.mode == "until_and_while_executing"
      keys.map { |key| release(key) }.any?
    end

    def inspect
      "#<#{self.class} #{locker.inspect}>"
    end

    private

    def job_lock(job_class, args)
      raise ArgumentError, "args must be the job's arguments as an Array, got #{args.inspect}" unless args.is_a?(Array)

      lock = job_class.respond_to?(:lock_manager_lock_for) && job_class.lock_manager_lock_for(args)
      lock or raise ArgumentError, "#{job_class.inspect} has no lock_with: no lock to release"
    end

    # The Locker's extension object: Admin reads through its pool and key prefix.
    def native
      @native ||= begin
        native = locker.backend
        unless native.respond_to?(:admin_scan)
          raise Error, "LockManager::Admin reads Redis: it cannot run on LockManager::Testing's in-process locks"
        end

        native
      end
    end

    def info(raw)
      key, limit, holders, waiters, parked = raw
      LockInfo.new(key: key, limit: limit, holders: holders.map { |h| holder(h) },
                   waiters: waiters.map { |w| waiter(w) }, parked: parked)
    end

    def holder(raw)
      token, jid, host, pid, thread, since_ms, ttl_ms = raw
      Holder.new(token: token, jid: jid, host: host, pid: pid, thread: thread,
                 since: since_ms && Time.at(0, since_ms, :millisecond), ttl: ttl_ms && (ttl_ms / 1000.0),
                 fencing_token: nil)
    end

    def waiter(raw)
      token, host, pid, thread, since_us = raw
      Waiter.new(token: token, host: host, pid: pid, thread: thread, since: Time.at(0, since_us, :microsecond))
    end
  end
end

require_relative "admin/limiters"
require_relative "admin/parked"
