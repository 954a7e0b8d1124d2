# frozen_string_literal: true

# ActiveJob classes on the Sidekiq adapter, without Rails, for spec/sidekiq/active_job_adapter_spec.rb.
# `sidekiq -r` loads it and configures from ENV (REDIS_URL, LOCK_PREFIX, TIMELINE_KEY); the spec loads
# it too, to enqueue the same classes with perform_later, and calls ActiveJobApp.configure itself.
# Sidekiq 6.4 runs Rails 6.1's adapter; Sidekiq 7.3 ships its own (active_job/queue_adapters/sidekiq_adapter.rb,
# first on the load path), whose JobWrapper inherits Sidekiq::ActiveJob::Wrapper.
# Every job records what it did in Redis, as demo/timeline.rb reads it; a job given a String as
# `hold` works until the spec sets the gate key "<TIMELINE_KEY>:gate:<hold>".

require "active_job"
require "sidekiq"
require_relative "../../lib/lock_manager"
require_relative "../../demo/timeline"

Redis.silence_deprecations = true if defined?(Redis) && Redis.respond_to?(:silence_deprecations=)

# Sidekiq 7 defines its ActiveJob wrapper in sidekiq/rails.rb, which needs Rails: a Sidekiq 7 app
# without Rails defines it as that file does.
if Gem::Version.new(Sidekiq::VERSION) >= Gem::Version.new("7") && !defined?(Sidekiq::ActiveJob::Wrapper)
  module Sidekiq
    module ActiveJob
      class Wrapper
        include ::Sidekiq::Job

        def perform(job_data)
          ::ActiveJob::Base.execute(job_data.merge("provider_job_id" => jid))
        end
      end
    end
  end
end

ActiveJob::Base.queue_adapter = :sidekiq
# What Sidekiq's Railtie does in a Rails app: ActiveJob classes take sidekiq_options.
ActiveJob::Base.include(Sidekiq::Worker::Options) unless ActiveJob::Base.respond_to?(:sidekiq_options)

# Where the app's locks and jobs live.
module ActiveJobApp
  module_function

  def configure(redis_url:, lock_prefix:)
    LockManager.configure do |c|
      c.redis_url = redis_url
      c.key_prefix = lock_prefix
    end
    Sidekiq.configure_server { |config| config.redis = { url: redis_url } }
    Sidekiq.configure_client { |config| config.redis = { url: redis_url } }
  end

  def record(job, event)
    Sidekiq.redis { |redis| Timeline.record(redis, job, event) }
  end

  def gate_open?(name)
    Sidekiq.redis { |redis| redis.call("EXISTS", "#{Timeline::KEY}:gate:#{name}") }.to_i == 1
  end
end

# Outermost server middleware: "start", then "done", or "skipped" when a lock (the middleware's or
# the job's callbacks') let nothing run. Recorded under the ActiveJob class and job_id.
class ActiveJobRecorder
  def call(_job_instance, job, _queue)
    data = job["args"].first
    recorded = { "class" => job["wrapped"].to_s, "jid" => data["job_id"], "args" => data["arguments"] }
    ActiveJobApp.record(recorded, "start")
    Thread.current[:active_job_app_ran] = false
    yield
    ActiveJobApp.record(recorded, Thread.current[:active_job_app_ran] ? "done" : "skipped")
  end
end

ActiveJobApp.configure(redis_url: ENV.fetch("REDIS_URL"), lock_prefix: ENV.fetch("LOCK_PREFIX")) if Sidekiq.server?
Sidekiq.configure_server { |config| config.server_middleware { |chain| chain.prepend(ActiveJobRecorder) } }

# The lock middlewares, which the classes with sidekiq_options only need (nothing else installs them:
# `include LockManager::Worker` in an ActiveJob class does not). Required after the recorder above:
# see LateMiddleware.
require_relative "../../lib/lock_manager/sidekiq"
require_relative "../../lib/lock_manager/worker"

# A server middleware the app adds after requiring lock_manager/sidekiq, as an initializer may: it
# counts the jobs it sees under "<TIMELINE_KEY>:late".
class LateMiddleware
  def call(_job_instance, _job, _queue)
    Sidekiq.redis { |redis| redis.call("INCR", "#{Timeline::KEY}:late") }
    yield
  end
end
Sidekiq.configure_server { |config| config.server_middleware { |chain| chain.add(LateMiddleware) } }

# perform(label, hold): "working", then hold (seconds, or a gate's name), then "finished <label>".
class ApplicationJob < ActiveJob::Base
  def perform(label, hold = 0)
    Thread.current[:active_job_app_ran] = true
    me = { "class" => self.class.name, "jid" => job_id, "args" => arguments }
    ActiveJobApp.record(me, "working")
    if hold.is_a?(String)
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 15
      sleep 0.02 until ActiveJobApp.gate_open?(hold) || Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
    else
      sleep hold
    end
    ActiveJobApp.record(me, "finished #{label}")
  end
end

# lock_with in an ActiveJob class: locked by its callbacks, left alone by the middlewares.
class AjNonblockingJob < ApplicationJob
  include LockManager::Worker
  lock_with :nonblocking
end

class AjOtherNonblockingJob < ApplicationJob
  include LockManager::Job
  lock_with :nonblocking
end

class AjReportJob < ApplicationJob
  include LockManager::Worker
  lock_with :until_executed, unique_for: 60
end

class AjOtherReportJob < ApplicationJob
  include LockManager::Worker
  lock_with :until_executed, unique_for: 60
end

# on_conflict: :reschedule through its callbacks: `retry_job` pushes it again through the adapter, its count
# of reschedules in its serialized data.
class AjBackoffJob < ApplicationJob
  include LockManager::Worker
  lock_with :nonblocking, key: "aj-backoff", on_conflict: :reschedule, max_reschedules: 5
end

# on_conflict: :park through its callbacks: the adapter's own push of the job parks it, and the release of
# the lock pushes it.
class AjParkJob < ApplicationJob
  include LockManager::Worker
  lock_with :nonblocking, key: "aj-park", on_conflict: :park, timeout: 5
end

# throttle_with on_limit: :park through its callbacks: a job over the concurrency rule parks through the
# adapter's own push, and the end of a job pushes the next with its place.
class AjThrottledParkJob < ApplicationJob
  include LockManager::Worker
  throttle_with concurrency: 2, key: "aj-throttle-park", on_limit: :park, timeout: 5
end

# Sidekiq's ActiveJob integration only: the Sidekiq middleware locks these, keyed on their own class.
class AjOptionsJob < ApplicationJob
  sidekiq_options lock_manager: { "mode" => "nonblocking" }
end

class AjOtherOptionsJob < ApplicationJob
  sidekiq_options lock_manager: { "mode" => "nonblocking" }
end
