# frozen_string_literal: true

module LockManager
  module ActiveJob
    # What an ActiveJob class with throttle_with does with a job its rules refused (JobThrottle.run).
    module Throttled
      private

      # Enqueued again (same job_id, so a unique job's lock goes with it) for when the rule would
      # admit it; OverLimit for the app's retry_on with on_limit: :raise, and on an adapter that
      # cannot schedule a job (:inline).
      def lock_manager_throttled(refusal)
        JobThrottle.handle(refusal, self.class.name, "job_id=#{job_id}",
                           log: ->(line) { logger&.info("lock_manager: #{line}") },
                           reschedule: ->(delay) { retry_job(wait: delay) })
      rescue NotImplementedError # the adapter's enqueue_at
        raise refusal.error
      end
    end
  end
end
