# frozen_string_literal: true

module LockManager
  module Sidekiq
    # A pending unique job removed through Sidekiq's API (deleted, killed, or cleared with its
    # queue or set) will not run: the lock its own jid still holds is released at once rather than
    # left to expire after unique_for. A lock another jid holds is never touched.
    module RemovedJobs
      module_function

      # Releases the locks `jobs` hold (Hashes, or JSON as Sidekiq keeps them), in one round trip.
      # A job whose lock cannot be made here (its class unknown to this process, an entry that is
      # not a job, a key Proc that raises) is left out: its lock expires after unique_for. So does
      # every lock of the batch when the locks' Redis fails.
      # @return [Boolean] false when the locks' Redis failed
      def release(jobs)
        locks = jobs.filter_map { |job| lock_of(job) }
        LockManager.locker.release_claims(locks.map(&:key), locks.map(&:token)) unless locks.empty?
        true
      rescue LockManager::Error => e
        LockManager.logger.warn("lock_manager: #{e.message}; the locks of #{locks.size} removed jobs " \
                                "expire after unique_for")
        false
      end

      # The lock the job claimed at its push, or nil: not unique, not known here, or :until_expired
      # (whose lock lives unique_for whatever happens to the job).
      def lock_of(job)
        job = ::Sidekiq.load_json(job) if job.is_a?(String)
        kept_unless_expiring(Jobs.enqueue_lock(job, nil)) if job.is_a?(Hash)
      rescue JSON::ParserError
        nil
      rescue StandardError => e
        LockManager.logger.warn("lock_manager: the lock of a removed #{job["class"] if job.is_a?(Hash)} job " \
                                "expires after unique_for: #{e.class}: #{e.message}")
        nil
      end

      def kept_unless_expiring(lock)
        lock unless lock.nil? || lock.options.until_expired?
      end
    end
  end
end
