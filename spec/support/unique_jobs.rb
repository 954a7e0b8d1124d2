# frozen_string_literal: true

# The unique jobs (lock_with :until_*) of spec/sidekiq/uniqueness_spec.rb. Loaded by the `sidekiq`
# processes (spec/support/sidekiq_jobs.rb requires it last) and by the spec itself, whose pushes go
# through the client middleware as a web process's would. Each records what it did in the timeline.
require_relative "../../demo/jobs"

module UniqueJobs
  # Seconds a pending job's lock lives at most.
  UNIQUE_FOR = 60

  # One pending or running per arguments: the default key is the class and a digest of the arguments.
  class UntilExecutedJob
    include LockManager::Worker
    include RecordedWork
    lock_with :until_executed, unique_for: UNIQUE_FOR

    def perform(id, seconds)
      work(seconds, "until_executed #{id}", [id, seconds])
    end
  end

  # The same arguments as UntilExecutedJob's never share its key.
  class OtherUntilExecutedJob
    include LockManager::Worker
    include RecordedWork
    lock_with :until_executed, unique_for: UNIQUE_FOR

    def perform(id, seconds)
      work(seconds, "other until_executed #{id}", [id, seconds])
    end
  end

  # One pending per arguments; its lock is released when it starts.
  class UntilExecutingJob
    include LockManager::Worker
    include RecordedWork
    lock_with :until_executing, unique_for: UNIQUE_FOR

    def perform(id, seconds)
      work(seconds, "until_executing #{id}", [id, seconds])
    end
  end

  # One pending per arguments, and one running: the run lock ("<key>:run") skips the others.
  class WhileExecutingJob
    include LockManager::Worker
    include RecordedWork
    lock_with :until_and_while_executing, unique_for: UNIQUE_FOR

    def perform(id, seconds)
      work(seconds, "while_executing #{id}", [id, seconds])
    end
  end

  # Fails every time; Sidekiq retries it twice at its default backoff (the first retry 15 s to 24 s later).
  class RetriedJob
    include LockManager::Worker
    include RecordedWork
    sidekiq_options retry: 2
    lock_with :until_executed, unique_for: UNIQUE_FOR

    def perform(id)
      work(0.3, "failing #{id}", [id])
      raise "#{self.class.name} #{id} fails"
    end
  end

  # Fails, and is not retried.
  class UnretriedJob < RetriedJob
    sidekiq_options retry: false
  end

  # Fails, and has no retry left: straight to the dead set.
  class ExhaustedJob < RetriedJob
    sidekiq_options retry: 0
  end

  # Fails on its first run, and succeeds when Sidekiq retries it a second later.
  class FlakyJob
    include LockManager::Worker
    include RecordedWork
    sidekiq_options retry: 1
    sidekiq_retry_in { 1 }
    lock_with :until_executed, unique_for: UNIQUE_FOR

    def perform(id)
      runs = Sidekiq.redis { |redis| redis.call("INCR", "flaky:#{id}") }
      raise "#{self.class.name} #{id} fails on its first run" if runs == 1

      work(0, "flaky #{id} succeeded", [id])
    end
  end

  # Pushed a thousand at a time to a queue no process reads.
  class BulkJob
    include LockManager::Worker
    include RecordedWork
    lock_with :until_executed, unique_for: UNIQUE_FOR

    def perform(number)
      work(0, "bulk #{number}", [number])
    end
  end

  # Killed or stopped while it sleeps: a running job's lock lives `timeout` (renewed while it runs).
  class SleeperJob
    include LockManager::Worker
    include RecordedWork
    lock_with :until_executed, timeout: 3, unique_for: UNIQUE_FOR

    def perform(seconds)
      work(seconds, "slept", [seconds])
    end
  end
end
