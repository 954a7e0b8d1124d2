# frozen_string_literal: true

# The seed's Sidekiq jobs, written with lock_with. Loaded by `sidekiq -r` (see bin/demo and
# spec/sidekiq); each job records what it did in Redis, so whoever enqueued it can check.
# Runs on Sidekiq 6.4 and 7: Sidekiq.redis yields redis-rb on 6, redis-client on 7 (Timeline takes both).

require_relative "../lib/lock_manager/worker"
require_relative "timeline"

# redis-rb 4.8 warns about calls Sidekiq 6.4 makes; Sidekiq 7 talks through redis-client and loads no redis-rb.
Redis.silence_deprecations = true if defined?(Redis) && Redis.respond_to?(:silence_deprecations=)

LockManager.configure do |c|
  c.redis_url = ENV.fetch("REDIS_URL")
  c.key_prefix = ENV.fetch("LOCK_PREFIX", "lock:")
end
Sidekiq.configure_server { |config| config.redis = { url: ENV.fetch("REDIS_URL") } }
Sidekiq.configure_client { |config| config.redis = { url: ENV.fetch("REDIS_URL") } }

# Outermost server middleware: "start" and "done" for every job, "skipped" when the lock
# middleware inside did not let it run.
class TimelineRecorder
  def call(_job_instance, job, _queue)
    Sidekiq.redis { |redis| Timeline.record(redis, job, "start") }
    Thread.current[:lock_manager_ran] = false
    yield
    Sidekiq.redis { |redis| Timeline.record(redis, job, Thread.current[:lock_manager_ran] ? "done" : "skipped") }
  end
end

Sidekiq.configure_server do |config|
  config.server_middleware { |chain| chain.prepend(TimelineRecorder) }
end

# Shared by the jobs below: mark the run, work, record the result.
module RecordedWork
  def work(seconds, result, args)
    Thread.current[:lock_manager_ran] = true
    job = { "class" => self.class.name, "jid" => jid, "args" => args }
    Sidekiq.redis { |redis| Timeline.record(redis, job, "working") }
    sleep seconds
    Sidekiq.redis { |redis| Timeline.record(redis, job, result) }
  end
end

# The seed's worker: five calls while the first sleeps, one result.
class MyWorker
  include LockManager::Worker
  include RecordedWork
  lock_with :nonblocking

  def perform(seconds = 1.5)
    work(seconds, "MyWorker result", [seconds])
  end
end

# The seed's second story: the same lock, blocking; all run, one after another.
class MyBlockingWorker
  include LockManager::Worker
  include RecordedWork
  lock_with :blocking, key: "MyWorker", timeout: 30

  def perform(seconds = 1.5)
    work(seconds, "MyWorker result", [seconds])
  end
end

# Seed 003: locked around an ID, so different users run in parallel.
class UserWorker
  include LockManager::Worker
  include RecordedWork
  lock_with :nonblocking, key: ->(user_id, *) { "user:#{user_id}" }

  def perform(user_id, seconds = 1.5)
    work(seconds, "user #{user_id} processed", [user_id, seconds])
  end
end

# Unique from push to finish: while one report for an account is pending or running, pushing
# another is refused (perform_async returns nil and logs who holds the lock).
class ReportJob
  include LockManager::Worker
  include RecordedWork
  lock_with :until_executed, key: ->(account_id, *) { "report:#{account_id}" }, unique_for: 60

  def perform(account_id, seconds = 1.0)
    work(seconds, "report #{account_id} sent", [account_id, seconds])
  end
end

# Throttled: at most 2 exports of an account in any 2 seconds. A third is not run and not retried:
# it is pushed back, with its own jid, for the moment the rule admits it.
class ExportJob
  include LockManager::Worker
  include RecordedWork
  throttle_with sliding_window: 2, per: 2, key: ->(account_id, *) { "exports:#{account_id}" }

  def perform(account_id, seconds = 0.2)
    work(seconds, "export #{account_id} sent", [account_id, seconds])
  end
end
