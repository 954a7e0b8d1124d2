# frozen_string_literal: true

module LockManager
  module Sidekiq
    # Sidekiq's testing modes (`require "sidekiq/testing"`, or Sidekiq 8.1's `Sidekiq.testing!`) run
    # every job through `process_job` and their own server middleware chain: fake's drain and
    # perform_one, inline's push. They define both when they load, which may be after the job classes
    # (an app that eager-loads them first): prepended to Sidekiq::Job::ClassMethods, this puts the
    # lock middleware in that chain as the first job runs, whatever was required first.
    module TestingRuns
      def process_job(job)
        LockManager::Sidekiq.install_testing
        super
      end
    end
  end
end
