# frozen_string_literal: true

module LockManager
  module Sidekiq
    # A job sent to the dead set through Sidekiq's API (SortedEntry#kill: the Retries page's Kill;
    # RetrySet#kill_all: its Kill All) releases its lock (RemovedJobs): a dead job does not run
    # unless an operator retries it, and that push claims the lock again. Every kill goes through
    # DeadSet#kill, one job at a time as Sidekiq moves them: one round trip more per job.
    module KilledJobs
      def kill(message, *)
        killed = super
        RemovedJobs.release([message])
        killed
      end
    end
  end
end
