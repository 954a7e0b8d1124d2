# frozen_string_literal: true

Rails.application.configure do
  config.cache_classes = false # code reloading (`enable_reloading = true` on Rails 7.1+)
  config.eager_load = false
  config.consider_all_requests_local = true
end
