# frozen_string_literal: true

module LockManager
  module ActiveJob
    # lock_with :until_expired in an ActiveJob class: the job's serialized data carries its lock's
    # expiry (UntilExpired), so that retry_on and the adapter's retries keep it.
    module Expiring
      def serialize
        expires_at = @lock_manager_expires_at
        expires_at ? super.merge(UntilExpired::EXPIRES => expires_at) : super
      end

      def deserialize(job_data)
        super
        @lock_manager_expires_at = job_data[UntilExpired::EXPIRES]
      end

      private

      # The lock this enqueue claims (UntilExpired.claiming), its expiry kept on the job; nil when
      # the job's lock has expired.
      def lock_manager_expiring(lock)
        lock = UntilExpired.claiming(lock, @lock_manager_expires_at, scheduled_at) or return
        @lock_manager_expires_at = lock.expires_at
        lock
      end
    end
  end
end
