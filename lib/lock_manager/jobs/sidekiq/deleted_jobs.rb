# frozen_string_literal: true

module LockManager
  module Sidekiq
    # A pending job deleted through Sidekiq's API (its Web UI's Delete button, a script's
    # `Sidekiq::ScheduledSet.new.find_job(jid).delete`) releases its lock (RemovedJobs).
    module DeletedJobs
      def delete
        deleted = super
        RemovedJobs.release([item]) if deleted && item.is_a?(Hash)
        deleted
      end
    end
  end
end
