# frozen_string_literal: true

# A small Rails app (no database) that mounts Sidekiq::Web at /sidekiq with the Locks tab as the README
# and docs/web.md tell an app to, for spec/web/rails_spec.rb. WebRailsAppServer boots a copy of it under
# Puma in development (code reloading on) or production, on the stack's Rails (6.1, 7.2) or RAILS=8.1.3 and
# Sidekiq (6.4, 7.3) or SIDEKIQ's. ENV: REDIS_URL, LOCK_PREFIX, RAILS_LOG_PATH; API_ONLY=1 makes it an
# API-only app with docs/web.md's session lines, API_ONLY=bare one without them.
require "rails"
require "action_controller/railtie"
# As Bundler.require does in a Rails app.
require "sidekiq"
require "lock_manager"

module WebRailsApp
  class Application < Rails::Application
    config.load_defaults "#{Rails::VERSION::MAJOR}.#{Rails::VERSION::MINOR}"
    config.secret_key_base = "lock_manager-web-spec-#{"0" * 48}"
    config.paths["log"] = ENV.fetch("RAILS_LOG_PATH")
    config.log_level = :info

    config.lock_manager.redis_url = ENV.fetch("REDIS_URL")
    config.lock_manager.key_prefix = ENV.fetch("LOCK_PREFIX")

    if ENV["API_ONLY"]
      config.api_only = true
      unless ENV["API_ONLY"] == "bare"
        # docs/web.md, "An API-only Rails app": the session Sidekiq::Web needs.
        config.session_store :cookie_store, key: "_web_rails_app_session"
        config.middleware.use ActionDispatch::Cookies
        config.middleware.use config.session_store, config.session_options
      end
    end
  end
end
