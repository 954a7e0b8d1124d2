# frozen_string_literal: true

# The demo's seed jobs plus the ones only the end-to-end specs need. Loaded by `sidekiq -r`.
require_relative "../../demo/jobs"

# Rescheduled jobs come back within about a second (Sidekiq's default is 5 s per process, after 10 s
# to 15 s of initial wait). Sidekiq 6.4 keeps its settings in Sidekiq.options; 7 in the Sidekiq::Config it
# yields, which still reads poll_interval_average (average_scheduled_poll_interval would keep the initial wait).
Sidekiq.configure_server do |config|
  settings = config.respond_to?(:[]=) ? config : Sidekiq.options
  settings[:poll_interval_average] = 0.5
end

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
