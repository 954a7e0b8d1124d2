# frozen_string_literal: true

# A Sidekiq app that loads no `lock_with` class at boot (`sidekiq -r spec/support/lazy_app.rb`), as
# an app that autoloads its job classes: LazyLoader, a plain job, requires the locked classes
# (lazy_job.rb) as it runs, after Sidekiq 7's capsule copied its middleware chains (on its first
# job). Nothing here installs lock_manager's middlewares; each `lock_with` must. See uniqueness_spec.rb.
require_relative "../../lib/lock_manager"
require_relative "../../demo/timeline"

Redis.silence_deprecations = true if defined?(Redis) && Redis.respond_to?(:silence_deprecations=)

LockManager.configure do |c|
  c.redis_url = ENV.fetch("REDIS_URL")
  c.key_prefix = ENV.fetch("LOCK_PREFIX")
end
Sidekiq.configure_server { |config| config.redis = { url: ENV.fetch("REDIS_URL") } }
Sidekiq.configure_client { |config| config.redis = { url: ENV.fetch("REDIS_URL") } }

# Loads the locked classes, then pushes LazyJob three times and LazyUniqueJob twice.
class LazyLoader
  include Sidekiq::Worker

  def perform(seconds)
    require_relative "lazy_job"
    pushed = { "LazyJob" => Array.new(3) { LazyJob.perform_async(seconds) },
               "LazyUniqueJob" => Array.new(2) { LazyUniqueJob.perform_async(seconds) } }
    record = { "class" => "LazyLoader", "jid" => jid, "args" => pushed }
    Sidekiq.redis { |redis| Timeline.record(redis, record, "pushed") }
  end
end
