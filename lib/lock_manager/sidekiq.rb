# frozen_string_literal: true

# The Sidekiq integration, as apps require it (`require "lock_manager/sidekiq"`); it lives in jobs/sidekiq.rb.
require_relative "jobs/sidekiq"
