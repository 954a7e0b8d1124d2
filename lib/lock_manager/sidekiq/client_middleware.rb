# frozen_string_literal: true

module LockManager
  module Sidekiq
    # Takes a unique job's lock as it is pushed (perform_async, perform_in, push, push_bulk, and
    # Sidekiq's own pushes of scheduled jobs and retries, which find it held by the same jid).
    # A refused push returns nil (push_bulk: nil or left out for it) and logs who holds the lock.
    class ClientMiddleware
      include ::Sidekiq::ClientMiddleware if defined?(::Sidekiq::ClientMiddleware)

      def call(worker_class, job, _queue, _redis_pool)
        lock, holder = BulkPush.current&.take(job) # claimed already, with the rest of its push_bulk
        unless lock
          lock = Jobs.enqueue_lock(job, worker_class)
          return yield unless lock

          holder = claim(lock, job)
        end
        return yield unless holder

        refused(lock, job, holder)
      end

      private

      # @return [nil] what a refused push returns
      def refused(lock, job, holder)
        Jobs.log("refused #{Jobs.class_name(job)} jid=#{job["jid"]}: lock #{lock.key.inspect} is held by jid=#{holder}")
        Instrumentation.conflict(lock, Jobs.class_name(job), job["jid"], refused_by: holder)
      end

      def claim(lock, job)
        holder = JobLock.claim([lock], [job["at"]]).first
        Thread.current[FailedPush::CLAIMED] = lock unless holder
        holder
      end
    end

    # Prepended to Sidekiq::Client: a push that fails after its job's lock was claimed (Sidekiq's
    # Redis down) releases the lock rather than leave it for unique_for.
    module FailedPush
      CLAIMED = :lock_manager_claimed

      def push(item)
        outer = Thread.current[CLAIMED]
        Thread.current[CLAIMED] = nil
        super
      rescue Exception # rubocop:disable Lint/RescueException -- a job not pushed leaves no lock
        Thread.current[CLAIMED]&.abandon
        raise
      ensure
        Thread.current[CLAIMED] = outer
      end
    end
  end
end
