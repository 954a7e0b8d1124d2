# frozen_string_literal: true

# The jobs of spec/sidekiq/cleared_jobs_spec.rb and spec/web/cleared_jobs_spec.rb: unique jobs of
# each mode, pushed by the spec and removed through Sidekiq's API or its Web UI (whose process loads
# this file too: it must know a class to find its job's lock). Nothing runs them.
require_relative "../../lib/lock_manager/worker"

module ClearableJobs
  # Long enough that no lock of these jobs expires while a spec looks at it.
  UNIQUE_FOR = 600

  class UntilExecutedJob
    include LockManager::Worker
    lock_with :until_executed, unique_for: UNIQUE_FOR

    def perform(*); end
  end

  class UntilExecutingJob
    include LockManager::Worker
    lock_with :until_executing, unique_for: UNIQUE_FOR

    def perform(*); end
  end

  class WhileExecutingJob
    include LockManager::Worker
    lock_with :until_and_while_executing, unique_for: UNIQUE_FOR

    def perform(*); end
  end

  # Its lock's key comes from a Proc, which refuses one argument: a job whose lock cannot be made.
  class KeyedJob
    include LockManager::Worker
    lock_with :until_executed, unique_for: UNIQUE_FOR, key: lambda { |id|
      raise ArgumentError, "no key for #{id}" if id == "unkeyable"

      "keyed:#{id}"
    }

    def perform(*); end
  end

  # No lock_with: nothing to release.
  class PlainJob
    include Sidekiq::Job

    def perform(*); end
  end
end
