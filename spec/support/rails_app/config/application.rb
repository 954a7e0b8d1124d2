# frozen_string_literal: true

# A minimal Rails app (6.1, 7.2 or 8.1; API only, ActiveRecord on SQLite, ActiveJob) that spec/rails boots under
# Puma, configured from ENV by RailsAppServer (spec/support/rails_app_server.rb): REDIS_URL (LOCK_REDIS_URL first),
# LOCK_PREFIX, ON_REDIS_ERROR, DATABASE_PATH (a fresh SQLite file per run), RAILS_LOG_PATH, RAILS_MAX_THREADS;
# LOCK_MANAGER_EXTRA (settings as JSON) and LOCK_MANAGER_LOG_PATH (a logger of the app's own) for the boot specs.
require "json"
require "logger"
require "rails"
require "active_record/railtie"
require "action_controller/railtie"
require "active_job/railtie"
# As Bundler.require does in a Rails app: after Rails, so the Railtie comes with it.
require "lock_manager"

module RailsApp
  class Application < Rails::Application
    config.load_defaults Rails::VERSION::STRING.to_f # each version's own defaults (6.1, 7.2, 8.1)
    config.api_only = true
    config.eager_load = true # Puma's threads never autoload
    config.consider_all_requests_local = false
    config.secret_key_base = "lock_manager-spec-#{"0" * 48}"
    config.paths["log"] = ENV.fetch("RAILS_LOG_PATH")
    config.log_level = :info
    config.active_job.queue_adapter = :test # only the boot specs enqueue jobs
    config.active_record.maintain_test_schema = false # config/environment.rb loads db/schema.rb into each database

    config.lock_manager.redis_url = ENV.fetch("LOCK_REDIS_URL") { ENV.fetch("REDIS_URL") } # an app's own variable
    config.lock_manager.key_prefix = ENV.fetch("LOCK_PREFIX")
    config.lock_manager.on_redis_error = ENV.fetch("ON_REDIS_ERROR", "raise").to_sym
    config.lock_manager.pool_size = Integer(ENV.fetch("RAILS_MAX_THREADS", "16")) # one per Puma thread
    config.lock_manager.read_timeout = 0.5
    JSON.parse(ENV.fetch("LOCK_MANAGER_EXTRA", "{}")).each { |name, value| config.lock_manager[name] = value }
    config.lock_manager.logger = Logger.new(ENV.fetch("LOCK_MANAGER_LOG_PATH")) if ENV["LOCK_MANAGER_LOG_PATH"]
  end
end
