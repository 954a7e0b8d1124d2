# frozen_string_literal: true

module LockManager
  # JobLock.claim (JobLock extends it): the enqueue locks of many unique jobs taken at once.
  module JobClaims
    # Takes the enqueue locks of these unique jobs: one round trip in all on one Redis. Each
    # lives `unique_for` seconds past the job's scheduled time. With `pushes:` (Claims#claim), each
    # job taken is pushed in the same round trip, a job with on_conflict: :replace may replace the
    # pending job of its key, and a ConnectionError is the caller's to decide.
    # @param scheduled_at [Array<Numeric, nil>] each job's scheduled time (epoch seconds), or nil
    # @return [Array<String, Array, nil>] per job: nil when its lock is taken, else the token holding
    #   it; [fencing token, token] when it took the lock of that pending job, which it replaced
    def claim(job_locks, scheduled_at, pushes: nil)
      ttls = pending(job_locks, scheduled_at)
      replies = if pushes
                  claimed(job_locks, ttls, pushes, replacing(job_locks))
                else
                  OnRedisError.claiming(job_locks.first.key, job_locks.size) { claimed(job_locks, ttls) }
                end
      replies.map { |reply| reply unless reply.is_a?(Integer) }
    end

    private

    # Seconds each lock lives while its job waits.
    def pending(job_locks, scheduled_at, now = Time.now.to_f)
      job_locks.zip(scheduled_at).map { |lock, at| lock.pending_for(at, now) }
    end

    # Which jobs may replace a pending one; nil when none may (no Array made for a push of others).
    def replacing(job_locks)
      job_locks.map { |lock| lock.options.replace? } if job_locks.any? { |lock| lock.options.replace? }
    end

    def claimed(job_locks, ttls, pushes = nil, replacing = nil)
      LockManager.locker.claim(job_locks.map(&:key), job_locks.map(&:token), ttls, pushes: pushes,
                                                                                   replacing: replacing)
    end
  end
end
