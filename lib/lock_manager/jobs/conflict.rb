# frozen_string_literal: true

module LockManager
  # What a job that found its lock held does (`on_conflict`), under Sidekiq and ActiveJob alike; each
  # framework says only how it logs a line about the job and how it runs the job again later.
  module JobConflict
    # The conflict event, then skip (a log line), reschedule (when and how often: JobBackoff) or raise
    # LockNotAcquired.
    # @param lock [JobLock] the lock #run found held
    # @param log [#call] called with the line's verb, the key held, and what to add ("skipped", key, "")
    # @param reschedule [#call] called with the seconds after which the job runs again, and the count
    #   of reschedules it carries then
    # @param reschedules [Integer] how many times the job was rescheduled already (JobBackoff.count)
    # @param reschedule_in [Proc, nil] the class's `reschedule_in` Proc (a Proc cannot travel in a job)
    def self.handle(lock, class_name, job_id, log:, reschedule:, reschedules: 0, reschedule_in: nil)
      Instrumentation.conflict(lock, class_name, job_id)
      backoff = lock.options.backoff
      case lock.options.on_conflict
      when "skip" then log.call("skipped", lock.held_key, "")
      when "reschedule"
        return exhausted(lock, reschedules, log) if backoff.exhausted?(reschedules)

        reschedule.call(backoff.delay(reschedules + 1, class_name, reschedule_in), reschedules + 1)
      else raise LockNotAcquired, lock.held_key
      end
    end

    # Past max_reschedules: skipped (one line), or LockNotAcquired.
    def self.exhausted(lock, done, log)
      raise LockNotAcquired, lock.held_key if lock.options.backoff.when_exhausted == "raise"

      log.call("skipped", lock.held_key, " after #{done} reschedules (max_reschedules)")
    end
    private_class_method :exhausted
  end
end
