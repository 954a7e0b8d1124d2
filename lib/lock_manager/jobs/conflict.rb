# frozen_string_literal: true

module LockManager
  # What a job that found its lock held does (`on_conflict`), under Sidekiq and ActiveJob alike; each
  # framework says only how it logs a line about the job and how it runs the job again later.
  module JobConflict
    # The conflict event, then skip (a log line), reschedule (in `reschedule_in` seconds plus up to a
    # quarter more, so that rescheduled jobs do not all come back at once) or raise LockNotAcquired.
    # @param lock [JobLock] the lock #run found held
    # @param log [#call] called with the line's verb and the key held ("skipped", key)
    # @param reschedule [#call] called with the seconds after which the job runs again
    def self.handle(lock, class_name, job_id, log:, reschedule:)
      Instrumentation.conflict(lock, class_name, job_id)
      case lock.options.on_conflict
      when "skip" then log.call("skipped", lock.held_key)
      when "reschedule" then reschedule.call(lock.options.reschedule_in * (1 + (rand / 4)))
      else raise LockNotAcquired, lock.held_key
      end
    end
  end
end
