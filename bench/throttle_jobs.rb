# frozen_string_literal: true

# The job classes of bench/throttle.rb, loaded by `sidekiq -r` (modelled on
# spec/support/throttled_jobs.rb). Each records, as its perform starts, [class, number, jid, time] in
# the Redis list "bench:ran"; a client middleware of the server records each push for later (a
# refused job pushed again) as [class, number, jid, pushed at, at] in "bench:pushed".
require "json"
require "sidekiq"
require "lock_manager"
require "lock_manager/worker"

LockManager.configure { |config| config.redis_url = ENV.fetch("REDIS_URL") }

# Records every push with an "at" that the server makes: the reschedules of both classes.
class RecordPushes
  def call(_worker_class, job, _queue, _redis_pool)
    if job["at"]
      record = [job["class"].to_s, job["args"][1], job["jid"], Time.now.to_f, job["at"]]
      Sidekiq.redis { |redis| redis.rpush("bench:pushed", JSON.generate(record)) }
    end
    yield
  end
end

Sidekiq.configure_server do |config|
  settings = config.respond_to?(:[]=) ? config : Sidekiq.options
  settings[:poll_interval_average] = Float(ENV.fetch("POLL", "0.5")) # Sidekiq's scheduled-set poll
  config.client_middleware { |chain| chain.add RecordPushes }
end

# Records each start of perform.
module RecordedStart
  def record(number)
    Sidekiq.redis do |redis|
      redis.rpush("bench:ran", JSON.generate([self.class.name, number, jid, Time.now.to_f]))
    end
  end
end

# 1 run a second per run of the bench, by each kind of rate rule: a refused job is promised its
# own moment and comes back at its retry_after.
class ThrottledBenchJob
  include LockManager::Worker
  include RecordedStart
  throttle_with rate: 1, per: 1, key: ->(run, *) { "bench-throttle:#{run}" }

  def perform(_run, number)
    record(number)
  end
end

class WindowBenchJob
  include LockManager::Worker
  include RecordedStart
  throttle_with window: 1, per: 1, key: ->(run, *) { "bench-window:#{run}" }

  def perform(_run, number)
    record(number)
  end
end

class SlidingBenchJob
  include LockManager::Worker
  include RecordedStart
  throttle_with sliding_window: 1, per: 1, key: ->(run, *) { "bench-sliding:#{run}" }

  def perform(_run, number)
    record(number)
  end
end

# The fixed-interval way: one at a time, each holding its lock 1 s; a refused job comes back in 1 s.
class FixedIntervalBenchJob
  include LockManager::Worker
  include RecordedStart
  lock_with :nonblocking, key: ->(run, *) { "bench-fixed:#{run}" }, on_conflict: :reschedule, reschedule_in: 1

  def perform(_run, number)
    record(number)
    sleep 1
  end
end
