# frozen_string_literal: true

module LockManager
  # lock_with :until_expired: the lock taken at the job's push lives unique_for (past its scheduled
  # time) whatever the job does: it is not released when the job starts, ends or fails. The job
  # carries when its lock expires (EXPIRES), so that its pushes again (a retry, a scheduled job come
  # due, a reschedule) keep that expiry rather than start it again; a push after it ended takes no lock.
  module UntilExpired
    # Where a job carries its lock's expiry (epoch seconds): the Sidekiq payload, ActiveJob's serialized data.
    EXPIRES = "lock_manager_expires_at"

    # The lock a push of the job claims, its expiry set: `lock` itself, or nil when the job carried
    # an expiry that has passed. Any other mode's lock is returned as it is.
    # @param carried [Float, nil] the expiry the job carries, if any
    # @param at [Numeric, Time, nil] the job's scheduled time
    def self.claiming(lock, carried, at, now = nil)
      return lock unless lock.options.until_expired?

      now ||= Time.now.to_f
      return if carried && carried.to_f <= now

      lock.expires_at = carried&.to_f || (now + lock.pending_for(at, now))
      lock
    end

    # .claiming for a Sidekiq payload, which then carries the expiry (a wrapped ActiveJob's serialized
    # data carries its own: Sidekiq's retry of it comes through here).
    def self.payload_lock(lock, payload)
      return lock unless lock.options.until_expired?

      carried = payload[EXPIRES] || (payload["wrapped"] && payload.dig("args", 0, EXPIRES))
      lock = claiming(lock, carried, payload["at"]) or return
      payload[EXPIRES] = lock.expires_at
      lock
    end
  end
end
