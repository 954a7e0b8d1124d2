# frozen_string_literal: true

module LockManager
  module Sidekiq
    # A pending unique job deleted through Sidekiq's API (its Web UI's Delete button, a script's
    # `Sidekiq::ScheduledSet.new.find_job(jid).delete`) releases its lock at once, rather than
    # leaving it to expire after unique_for. Only a lock its own jid holds is released. Clearing
    # a whole queue or set does not go job by job: those locks expire after unique_for.
    module DeletedJobs
      def delete
        deleted = super
        DeletedJobs.release(item) if deleted
        deleted
      end

      def self.release(job)
        Jobs.enqueue_lock(job, nil)&.abandon if job.is_a?(Hash)
      end
    end
  end
end
