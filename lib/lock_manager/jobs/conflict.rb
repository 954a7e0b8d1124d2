# frozen_string_literal: true

module LockManager
  # What a job that found its lock held does (`on_conflict`), under Sidekiq and ActiveJob alike; each
  # framework says only how it logs a line about the job and how it runs the job again later.
  module JobConflict
    # The conflict event, then skip (a log line), reschedule (in `reschedule_in` seconds plus up to a
    # quarter more, so that rescheduled jobs do not all come back at once), raise LockNotAcquired, or
    # park (see .parked).
    # @param lock [JobLock] the lock #run found held
    # @param log [#call] called with the line's verb and the key held ("skipped", key)
    # @param reschedule [#call] called with the seconds after which the job runs again
    # @param park [#call, nil] parks the job: returns Claims#park's reply, or nil where it cannot
    def self.handle(lock, class_name, job_id, log:, reschedule:, park: nil)
      Instrumentation.conflict(lock, class_name, job_id)
      case lock.options.on_conflict
      when "skip" then log.call("skipped", lock.held_key)
      when "reschedule" then reschedule.call(later(lock))
      when "park" then parked(lock, park&.call, log: log, reschedule: reschedule)
      else raise LockNotAcquired, lock.held_key
      end
    end

    # A parked job waits for the release; one over `park_limit` does as `when_full` says; where it
    # cannot park (Sidekiq's Redis is not the locks') it is rescheduled.
    def self.parked(lock, outcome, log:, reschedule:)
      state, count = outcome
      case state
      when :parked then log.call("parked (#{count} in line)", lock.held_key)
      when :handed then log.call("parked and pushed again at once (the lock came free)", lock.held_key)
      when :full then full(lock, count, log: log, reschedule: reschedule)
      else
        log.call("rescheduled, not parked (Sidekiq's Redis is not the locks')", lock.held_key)
        reschedule.call(later(lock))
      end
    end

    def self.full(lock, count, log:, reschedule:)
      case lock.options.when_full
      when "skip" then log.call("skipped (#{count} parked, park_limit)", lock.held_key)
      when "reschedule" then reschedule.call(later(lock))
      else raise LockNotAcquired, lock.held_key
      end
    end

    def self.later(lock)
      lock.options.reschedule_in * (1 + (rand / 4))
    end
    private_class_method :parked, :full, :later
  end
end
