# frozen_string_literal: true

module LockManager
  module ActiveJob
    # What an ActiveJob class with throttle_with does with a job its rules refused (JobThrottle.run).
    module Throttled
      # Where the serialized job carries what its rules promised it (JobThrottle::Refusal#promises).
      PROMISES = "lock_manager_promises"

      def serialize
        promises = @lock_manager_promises
        promises.nil? || promises.empty? ? super : super.merge(PROMISES => promises)
      end

      def deserialize(job_data)
        super
        @lock_manager_promises = job_data[PROMISES]
      end

      private

      # Enqueued again (same job_id, so a unique job's lock goes with it) for when the rule would
      # admit it, or parked until a place is free (on_limit: :park, on Sidekiq's adapter);
      # OverLimit for the app's retry_on with on_limit: :raise, and on an adapter that cannot
      # schedule a job (:inline).
      def lock_manager_throttled(refusal)
        @lock_manager_promises = refusal.promises
        refusal.handle(self.class.name, "job_id=#{job_id}",
                       log: ->(line) { logger&.info("lock_manager: #{line}") },
                       reschedule: ->(delay) { retry_job(wait: delay) },
                       park: -> { lock_manager_park(refusal.spot(job_id)) })
      rescue NotImplementedError # the adapter's enqueue_at
        raise refusal.error
      end
    end
  end
end
