# frozen_string_literal: true

# Jobs with throttle_with rules, for spec/sidekiq/throttle_spec.rb. Loaded by `sidekiq -r`, and by the
# spec, whose pushes go through the client middleware as a web process's would (it configures its
# own Locker). Each job records its run (what, jid, time) in the list "ran" of LOCK_PREFIX.
require "json"
require "sidekiq"
require "lock_manager"
require "lock_manager/worker"

if ENV["LOCK_PREFIX"]
  LockManager.configure do |config|
    config.redis_url = ENV.fetch("REDIS_URL")
    config.key_prefix = ENV.fetch("LOCK_PREFIX")
  end
end

require_relative "fast_poll" # scheduled jobs come back within about a second

# Records each run.
module RecordedRun
  def record(what)
    Sidekiq.redis { |redis| redis.rpush("#{ENV.fetch("LOCK_PREFIX")}ran", JSON.generate([what, jid, Time.now.to_f])) }
  end
end

# Two rules: 2 exports per account and hour, and the partner's 1 call per minute.
class PartnerExportJob
  include LockManager::Worker
  include RecordedRun
  throttle_with window: 2, per: 3600, key: ->(account, *) { "exports:#{account}" }
  throttle_with sliding_window: 1, per: 60, key: ->(_account, partner) { "partner:#{partner}" }

  def perform(account, _partner)
    record(account)
  end
end

# One run every 2 s: the refused one comes back when the rule admits it.
class SoonJob
  include LockManager::Worker
  include RecordedRun
  throttle_with sliding_window: 1, per: 2, key: ->(run, *) { "soon:#{run}" }

  def perform(run, number)
    record("#{run}-#{number}")
  end
end

# One run every 2 s, one at a time: jobs refused together are each promised their own moment.
class SmoothJob
  include LockManager::Worker
  include RecordedRun
  throttle_with rate: 1, per: 2, key: ->(run, *) { "smooth:#{run}" }

  def perform(run, number)
    record("#{run}-#{number}")
  end
end

# Unique until executed, and throttled: the rescheduled job keeps its jid and its lock.
class UniqueThrottledJob
  include LockManager::Worker
  include RecordedRun
  lock_with :until_executed, unique_for: 600
  throttle_with window: 1, per: 3600, key: ->(run, *) { "unique:#{run}" }

  def perform(run, number)
    record("#{run}-#{number}")
  end
end

# Over its limit: raises OverLimit into Sidekiq's retries.
class RaisingThrottledJob
  include LockManager::Worker
  include RecordedRun
  sidekiq_options retry: 1
  throttle_with window: 1, per: 3600, key: ->(run, *) { "raising:#{run}" }, on_limit: :raise

  def perform(run, number)
    record("#{run}-#{number}")
  end
end

# One at a time per run: the second waits for the first's place, coming back every half second.
class OneAtATimeJob
  include LockManager::Worker
  include RecordedRun
  throttle_with concurrency: 1, key: ->(run, *) { "one:#{run}" }, timeout: 10, reschedule_in: 0.5

  def perform(run, number)
    record("#{run}-#{number}-start")
    sleep 1
    record("#{run}-#{number}-end")
  end
end

# Locked and throttled: a run its lock refuses gives back the window's unit.
class LockedThrottledJob
  include LockManager::Worker
  include RecordedRun
  lock_with :nonblocking, key: ->(run, *) { "locked:#{run}" }
  throttle_with window: 5, per: 3600, key: ->(run, *) { "locked-window:#{run}" }

  def perform(run)
    record(run)
  end
end

# Two rules on one job, for the load example: 2 a second with a burst of 2, and 12 an hour. Each run
# records [jid, number, Redis's TIME] in the list "started:<run>" of LOCK_PREFIX: the clock the rules
# decide on.
class TwoRulesJob
  include LockManager::Worker
  throttle_with rate: 2, per: 1, burst: 2, key: ->(run, *) { "two-rules-rate:#{run}" }
  throttle_with window: 12, per: 3600, key: ->(run, *) { "two-rules-window:#{run}" }

  def perform(run, number)
    Sidekiq.redis do |redis|
      seconds, micros = redis.call("TIME").map(&:to_i)
      redis.call("RPUSH", "#{ENV.fetch("LOCK_PREFIX")}started:#{run}",
                 JSON.generate([jid, number, seconds + (micros / 1_000_000.0)]))
    end
    sleep 0.1 # some work, while the other threads take jobs
  end
end
