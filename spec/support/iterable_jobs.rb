# frozen_string_literal: true

# Iterable jobs (Sidekiq 7.3+) with lock_with, for spec/sidekiq/iterable_spec.rb: `sidekiq -r` loads
# this file. Each iteration records its item and the value of the job's lock key (who holds it) in
# the timeline; Sidekiq interrupts an iteration when it stops (TERM) and pushes the job back with its
# cursor.
require_relative "sidekiq_jobs"

# Sidekiq 8 interrupts an iteration that ran this long, and pushes it back at once.
if ENV["MAX_ITERATION_RUNTIME"]
  Sidekiq.configure_server { |config| config[:max_iteration_runtime] = Float(ENV["MAX_ITERATION_RUNTIME"]) }
end

module IterableJobs
  UNIQUE_FOR = 60

  # Records each item, slowly enough for the spec to stop Sidekiq in the middle.
  module RecordedItems
    def build_enumerator(count, cursor:)
      array_enumerator((0...count).to_a, cursor: cursor)
    end

    def each_iteration(item, _count)
      job = { "class" => self.class.name, "jid" => jid, "args" => [item, LockManager.locker.holder(lock_key)] }
      Sidekiq.redis { |redis| Timeline.record(redis, job, "item") }
      sleep 0.2
    end

    def on_complete
      job = { "class" => self.class.name, "jid" => jid, "args" => [] }
      Sidekiq.redis { |redis| Timeline.record(redis, job, "complete") }
    end
  end

  # Held by its jid from push to the end of its last iteration. No retry: an error ends it.
  class UntilExecutedJob
    include Sidekiq::IterableJob
    include LockManager::Worker
    include RecordedItems
    sidekiq_options queue: "iterable", retry: false
    lock_with :until_executed, key: "iter-unique", unique_for: UNIQUE_FOR

    def lock_key = "iter-unique"
  end

  # Runs while nobody else holds "iter-run"; rescheduled when someone does.
  class NonblockingJob
    include Sidekiq::IterableJob
    include LockManager::Worker
    include RecordedItems
    sidekiq_options queue: "iterable"
    lock_with :nonblocking, key: "iter-run", on_conflict: :reschedule, reschedule_in: 0.5

    def lock_key = "iter-run"
  end

  # Waits for "iter-wait" when someone holds it.
  class BlockingJob
    include Sidekiq::IterableJob
    include LockManager::Worker
    include RecordedItems
    sidekiq_options queue: "iterable"
    lock_with :blocking, key: "iter-wait", timeout: 30

    def lock_key = "iter-wait"
  end
end
