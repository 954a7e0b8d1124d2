# frozen_string_literal: true

# The demo's seed jobs plus the ones only the end-to-end specs need. Loaded by `sidekiq -r`.
require_relative "../../demo/jobs"

require_relative "fast_poll" # scheduled jobs come back within about a second

# Finds its lock held: comes back later.
class RescheduleWorker
  include LockManager::Worker
  include RecordedWork
  lock_with :nonblocking, key: "held-by-the-spec", on_conflict: :reschedule, reschedule_in: 1

  def perform
    work(0, "rescheduled job ran", [])
  end
end

# Finds its lock held: fails, and Sidekiq's retry takes over.
class RaiseWorker
  include LockManager::Worker
  include RecordedWork
  sidekiq_options retry: 3
  lock_with :nonblocking, key: "held-by-the-spec", on_conflict: :raise

  def perform
    work(0, "raise job ran", [])
  end
end

# At most two at a time.
class LimitedWorker
  include LockManager::Worker
  include RecordedWork
  lock_with :blocking, key: "limited", limit: 2, timeout: 30

  def perform(number)
    work(0.4, "limited #{number}", [number])
  end
end

# Holds or waits for the "shutdown" lock for a long time: for the TERM spec.
class LongBlockingWorker
  include LockManager::Worker
  include RecordedWork
  lock_with :blocking, key: "shutdown", timeout: 60

  def perform(number)
    work(30, "long #{number}", [number])
  end
end

require_relative "unique_jobs" # the unique jobs of spec/sidekiq/uniqueness_spec.rb
