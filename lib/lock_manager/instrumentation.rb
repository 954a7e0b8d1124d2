# frozen_string_literal: true

module LockManager
  # The events of lock calls (see Events), built only when someone listens: with no subscriber
  # each method returns after one check, allocating nothing.
  module Instrumentation
    ACQUIRE = "acquire.lock_manager"
    RELEASE = "release.lock_manager"
    RENEW = "renew.lock_manager"
    LOST = "lost.lock_manager"
    CONFLICT = "conflict.lock_manager"
    THROTTLE = "throttle.lock_manager"

    module_function

    # @return [Float, nil] the monotonic clock when acquire events are listened to, else nil
    def started
      clock if Events.on?(ACQUIRE)
    end

    # @param started [Float] what #started returned
    # @param wait [Float, Symbol, nil] a block call's wait (nil: nonblocking), or the mode itself
    # @param contended [Boolean, nil] whether the first attempt found the key held
    def acquired(key, started, wait, limit, fencing_token, contended) # rubocop:disable Metrics/ParameterLists
      return unless started

      Events.emit(ACQUIRE, { key: key, mode: mode(wait), limit: limit, waited: clock - started, acquired: true,
                             fencing_token: fencing_token, contended: contended == true }, started)
    end

    # A Limiter's decision (asked only when someone listens to THROTTLE).
    # @param job [Hash, nil] { class:, jid: } for a job's rule
    def throttled(limiter, cost, limit, job = nil)
      payload = { limiter: limiter.name, rule: limiter.rule.to_s, cost: cost, admitted: limit.admitted?,
                  remaining: limit.remaining, retry_after: limit.retry_after }
      Events.emit(THROTTLE, job ? payload.merge(job) : payload)
    end

    # The lock was not acquired: taken (nonblocking), the wait ran out (blocking), or Redis could
    # not be reached (`error`, with on_redis_error :run or :skip).
    # @return [nil]
    def refused(key, started, wait:, limit:, error: nil)
      return unless started

      payload = { key: key, mode: mode(wait), limit: limit, waited: clock - started, acquired: false,
                  fencing_token: nil, contended: error.nil? }
      payload[:error] = error if error
      Events.emit(ACQUIRE, payload, started)
    end

    # try_lock and lock: the acquire event of the Native::Lock the block returns (nil: taken).
    def acquiring(key, mode)
      started = self.started
      lock = yield
      return lock unless started

      if lock
        acquired(key, started, mode, 1, lock.fencing_token, nil)
      else
        refused(key, started, wait: mode, limit: 1)
      end
      lock
    rescue LockNotAcquired
      refused(key, started, wait: mode, limit: 1)
      raise
    end

    # A claim or an adoption (Claims): `reply` is the fencing token or the lock when taken, else
    # the holder's token (or nil).
    def claimed(key, started, mode, reply)
      if reply.is_a?(String) || reply.nil?
        refused(key, started, wait: mode, limit: 1)
      else
        token = reply.is_a?(Integer) ? reply : reply.fencing_token
        acquired(key, started, mode, 1, token, false)
      end
    end

    def mode(wait)
      return wait if wait.is_a?(Symbol)

      wait ? :blocking : :nonblocking
    end

    # After a release (a block's, or Lock#release): `held` is false when the lock was lost
    # meanwhile. The block gives the seconds it was held, asked only when someone listens.
    def released(key, held)
      return unless Events.on?(RELEASE)

      Events.emit(RELEASE, { key: key, held: yield, released: held, lost: !held })
    end

    # @param error [LockLost] what the app is told (or raised)
    def lost(key, held_for, error)
      return unless Events.on?(LOST)

      Events.emit(LOST, { key: key, held: held_for, reason: error.message })
    end

    # The renewal thread found a renewed lock lost while its holder had it (see LeaseEvents).
    def lost_by_renewal(key, held_for, cause)
      return unless Events.on?(LOST)

      Events.emit(LOST, { key: key, held: held_for, reason: "lock #{key.inspect} was lost while held: #{cause}" })
    end

    # A renewal: Lock#refresh, Lock#keep, and the renewal thread's (see LeaseEvents).
    def renewed(key, seconds, renewed)
      return unless Events.on?(RENEW)

      Events.emit(RENEW, { key: key, ttl: seconds, renewed: renewed })
    end

    # A job whose lock (a JobLock) is held: not pushed (`refused_by` the holder's jid), or skipped,
    # rescheduled or raised as its on_conflict says.
    # @return [nil]
    def conflict(job_lock, job_class, jid, refused_by: nil, reschedules: nil)
      return unless Events.on?(CONFLICT)

      strategy = refused_by ? job_lock.options.mode : job_lock.options.on_conflict
      Events.emit(CONFLICT, { key: job_lock.held_key || job_lock.key, class: job_class, jid: jid, strategy: strategy,
                              holder: refused_by || job_lock.holder, reschedules: reschedules })
    end

    def clock
      Process.clock_gettime(Process::CLOCK_MONOTONIC)
    end
  end
end
