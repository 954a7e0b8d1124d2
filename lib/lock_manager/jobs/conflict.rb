# frozen_string_literal: true

module LockManager
  # What a job that found its lock held does (`on_conflict`), under Sidekiq and ActiveJob alike; each
  # framework says only how it logs a line about the job and how it runs the job again later.
  module JobConflict
    # A job's conflict, as its framework tells it: how to log and reschedule it, and how to park it.
    # @!attribute log [#call] called with the line's verb, the key held, and what to add ("skipped", key, "")
    # @!attribute reschedule [#call] called with the seconds after which the job runs again, and the count
    #   of reschedules it carries then
    # @!attribute park [#call, nil] parks the job: returns Claims#park's reply, or nil where it cannot
    # @!attribute reschedules [Integer] how many times the job was rescheduled already (JobBackoff.count)
    # @!attribute reschedule_in [Proc, nil] the class's `reschedule_in` Proc (a Proc cannot travel in a job)
    Ways = Struct.new(:class_name, :log, :reschedule, :park, :reschedules, :reschedule_in, keyword_init: true)

    # The conflict event, then skip (a log line), reschedule (when and how often: JobBackoff), raise
    # LockNotAcquired, or park (see .parked).
    # @param lock [JobLock] the lock #run found held
    def self.handle(lock, class_name, job_id, log:, reschedule:, park: nil, reschedules: 0, reschedule_in: nil)
      Instrumentation.conflict(lock, class_name, job_id, reschedules: reschedules)
      ways = Ways.new(class_name: class_name, log: log, reschedule: reschedule, park: park,
                      reschedules: reschedules, reschedule_in: reschedule_in)
      case lock.options.on_conflict
      when "skip", "replace" then log.call("skipped", lock.held_key, "") # replace acts at push
      when "reschedule" then rescheduled(lock, ways)
      when "park" then parked(lock, park&.call, ways)
      else raise LockNotAcquired, lock.held_key
      end
    end

    # Pushed again after the backoff's delay; past max_reschedules, skipped (one line) or LockNotAcquired.
    def self.rescheduled(lock, ways)
      backoff = lock.options.backoff
      done = ways.reschedules
      return exhausted(lock, done, ways) if backoff.exhausted?(done)

      ways.reschedule.call(backoff.delay(done + 1, ways.class_name, ways.reschedule_in), done + 1)
    end

    def self.exhausted(lock, done, ways)
      raise LockNotAcquired, lock.held_key if lock.options.backoff.when_exhausted == "raise"

      ways.log.call("skipped", lock.held_key, " after #{done} reschedules (max_reschedules)")
    end

    # A parked job waits for the release; one over `park_limit` does as `when_full` says; where it
    # cannot park (Sidekiq's Redis is not the locks', an ActiveJob adapter not Sidekiq's) it is rescheduled.
    def self.parked(lock, outcome, ways)
      state, count = outcome
      case state
      when :parked then ways.log.call("parked", lock.held_key, " (#{count} in line)")
      when :handed then ways.log.call("parked", lock.held_key, ", and pushed again at once: the lock came free")
      when :full then full(lock, count, ways)
      else
        ways.log.call("not parked", lock.held_key, " (a job parks where Sidekiq pushes it to the locks' Redis): " \
                                                   "rescheduled")
        rescheduled(lock, ways)
      end
    end

    def self.full(lock, count, ways)
      case lock.options.when_full
      when "skip" then ways.log.call("skipped", lock.held_key, " (#{count} parked: park_limit)")
      when "reschedule" then rescheduled(lock, ways)
      else raise LockNotAcquired, lock.held_key
      end
    end
    private_class_method :rescheduled, :exhausted, :parked, :full
  end
end
