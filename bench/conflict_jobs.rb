# frozen_string_literal: true

# The job classes of bench/conflicts.rb, loaded by `sidekiq -r`. Every job's start (by the outermost
# server middleware, before any lock) is recorded as [class, number, jid, time] in the Redis list
# "bench:started"; each job's work as [class, number, from, to] in "bench:worked"; every push the server
# makes for later (a reschedule) as [class, number] in "bench:pushed".
require "json"
require "sidekiq"
require "lock_manager"
require "lock_manager/worker"

LockManager.configure { |config| config.redis_url = ENV.fetch("REDIS_URL") }

# The outermost server middleware: every start, the parked jobs' fallback (Unpark) included.
class RecordStarts
  def call(_job_instance, job, _queue)
    record = [job["class"].to_s, Array(job["args"])[1], job["jid"], Time.now.to_f]
    Sidekiq.redis { |redis| redis.rpush("bench:started", JSON.generate(record)) }
    yield
  end
end

# Every push for later the server makes: the reschedules (not the scheduler's pushes of them when due).
class RecordPushes
  def call(_worker_class, job, _queue, _redis_pool)
    if job["at"]
      Sidekiq.redis { |redis| redis.rpush("bench:pushed", JSON.generate([job["class"].to_s, job["args"][1]])) }
    end
    yield
  end
end

Sidekiq.configure_server do |config|
  settings = config.respond_to?(:[]=) ? config : Sidekiq.options
  settings[:poll_interval_average] = Float(ENV.fetch("POLL", "0.5")) # Sidekiq's scheduled-set poll
  config.client_middleware { |chain| chain.add RecordPushes }
  config.server_middleware { |chain| chain.prepend RecordStarts }
end

# Job 0 holds the lock HOLD seconds; every other works WORK seconds.
module RecordedWork
  def work(number)
    from = Time.now.to_f
    sleep(number.zero? ? Float(ENV.fetch("HOLD", "2")) : Float(ENV.fetch("WORK", "0.02")))
    record = [self.class.name, number, from, Time.now.to_f]
    Sidekiq.redis { |redis| redis.rpush("bench:worked", JSON.generate(record)) }
  end
end

class ParkBenchJob
  include LockManager::Worker
  include RecordedWork
  lock_with :nonblocking, key: ->(run, *) { "bench-park:#{run}" }, on_conflict: :park

  def perform(_run, number)
    work(number)
  end
end

class FixedBenchJob
  include LockManager::Worker
  include RecordedWork
  lock_with :nonblocking, key: ->(run, *) { "bench-fixed:#{run}" }, on_conflict: :reschedule, reschedule_in: 1

  def perform(_run, number)
    work(number)
  end
end

class BackoffBenchJob
  include LockManager::Worker
  include RecordedWork
  lock_with :nonblocking, key: ->(run, *) { "bench-backoff:#{run}" }, on_conflict: :reschedule # 1, 2, 4 ... s

  def perform(_run, number)
    work(number)
  end
end

# The same through a concurrency rule of one place: parked, or pushed again every second.
class ThrottleParkBenchJob
  include LockManager::Worker
  include RecordedWork
  throttle_with concurrency: 1, key: ->(run, *) { "bench-tpark:#{run}" }, on_limit: :park

  def perform(_run, number)
    work(number)
  end
end

class ThrottleFixedBenchJob
  include LockManager::Worker
  include RecordedWork
  throttle_with concurrency: 1, key: ->(run, *) { "bench-tfixed:#{run}" }, reschedule_in: 1

  def perform(_run, number)
    work(number)
  end
end
