# frozen_string_literal: true

module LockManager
  module ActiveJob
    # What an ActiveJob job does when it finds its lock held (JobConflict): with on_conflict: :reschedule
    # it is enqueued again (same job_id) by `retry_job(wait:)`, its serialized data carrying how many
    # times it was (JobBackoff::COUNT). Running forgets the count: a retry_on after a failure starts
    # again; a retry_on of LockNotAcquired (when_exhausted: :raise) keeps it.
    module Rescheduled
      def serialize
        count = @lock_manager_reschedules
        count ? super.merge(JobBackoff::COUNT => count) : super
      end

      def deserialize(job_data)
        super
        count = JobBackoff.count(job_data)
        @lock_manager_reschedules = (count if count.positive?)
      end

      private

      # Runs the job (its lock taken): the reschedules before it are over.
      def lock_manager_running
        @lock_manager_reschedules = nil
        yield
      end

      def lock_manager_conflict(lock)
        JobConflict.handle(lock, self.class.name, job_id,
                           reschedules: @lock_manager_reschedules.to_i,
                           reschedule_in: self.class.lock_manager_reschedule_in,
                           log: ->(what, key, more) { lock_manager_log(what, key, "#{lock_manager_by(lock)}#{more}") },
                           reschedule: ->(seconds, count) { lock_manager_reschedule(lock, seconds, count) },
                           park: -> { lock_manager_park(lock.parking_spot) })
      end

      def lock_manager_by(lock)
        lock.holder ? " by #{lock.holder}" : ""
      end

      # LockNotAcquired on an adapter that cannot schedule a job (:inline).
      def lock_manager_reschedule(lock, seconds, count)
        @lock_manager_reschedules = count
        retry_job(wait: seconds)
        logger&.info("lock_manager: rescheduled #{self.class.name} job_id=#{job_id} in #{seconds.round(1)}s " \
                     "(reschedule #{count}): lock #{lock.held_key.inspect} is held")
      rescue NotImplementedError # the adapter's enqueue_at
        raise LockNotAcquired, lock.held_key
      end
    end
  end
end
