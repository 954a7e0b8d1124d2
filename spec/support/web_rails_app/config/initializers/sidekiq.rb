# frozen_string_literal: true

Sidekiq.configure_client { |config| config.redis = { url: ENV.fetch("REDIS_URL") } }
