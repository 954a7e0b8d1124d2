# frozen_string_literal: true

module LockManager
  module Sidekiq
    # Takes a unique job's lock as it is pushed (perform_async, perform_in, push, push_bulk, and
    # Sidekiq's own pushes of scheduled jobs and retries, which find it held by the same jid).
    # A refused push returns nil (push_bulk: nil or left out for it) and logs who holds the lock.
    class ClientMiddleware
      include ::Sidekiq::ClientMiddleware if defined?(::Sidekiq::ClientMiddleware)

      def call(worker_class, job, _queue, redis_pool, &block)
        parking = job["wrapped"] && Parking.requested(job) # an ActiveJob that parks: its push is its park
        return OnePush.deferring(parking, &block) if parking

        lock, holder = BulkPush.take(job) # claimed already, with the rest of its push_bulk
        return holder ? Jobs.refused(lock, job, holder) : yield if lock

        lock = Jobs.enqueue_lock(job, worker_class)
        lock &&= UntilExpired.payload_lock(lock, job)
        lock ? claimed(lock, job, redis_pool, &block) : yield
      end

      private

      # A unique job's push: its claim travels with it (OnePush), or is taken first.
      def claimed(lock, job, redis_pool, &block)
        return OnePush.deferring(lock, &block) if OnePush.possible?(redis_pool)

        holder = JobLock.claim([lock], [job["at"]]).first
        holder ? Jobs.refused(lock, job, holder) : FailedPush.pushing(lock, &block)
      end
    end

    # A job whose lock was claimed before its push: the claim travels with the job, on the payload
    # the middleware chain returns (what Sidekiq then writes), for OnePush::Push to release when
    # the write fails (Sidekiq's Redis down) rather than leave it for unique_for.
    module FailedPush
      CLAIMED = :@lock_manager_push_claim

      # Runs the rest of the middleware chain for a job whose lock was claimed: an error there
      # releases the lock; the payload it returns carries the lock to the write.
      def self.pushing(lock)
        payload = yield
        payload.instance_variable_set(CLAIMED, lock) if payload.is_a?(Hash) && !payload.frozen?
        payload
      rescue Exception # rubocop:disable Lint/RescueException -- a job not pushed leaves no lock
        lock.abandon
        raise
      end
    end
  end
end
