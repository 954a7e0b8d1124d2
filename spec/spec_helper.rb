# frozen_string_literal: true

require "securerandom"
require "timeout"
require_relative "support/stack"

# SIDEKIQ, RAILS: the vendored versions ahead of the stack's own gems, before any spec requires them,
# here and in every process a spec starts; checked, so that nothing runs on another version unseen.
Stack.select!
Stack.check!

require_relative "support/redis_server"
require_relative "support/key_slots"
require_relative "support/helpers"
require_relative "support/sidekiq_process"

# The suite's own redis-server (REDIS_URL points it at another one: then keys are isolated by
# a random prefix per example and nothing is flushed).
unless ENV["REDIS_URL"]
  SUITE_REDIS = RedisServer.new.start
  ENV["REDIS_URL"] = SUITE_REDIS.url
  at_exit { SUITE_REDIS.shutdown }
end

require "lock_manager"

# The settings a developer's environment gives (LOCK_MANAGER_REDIS_URL...) never reach the suite's Lockers.
(LockManager::Configuration::ENVIRONMENT.values.flatten - ["REDIS_URL"]).each { |name| ENV.delete(name) }

# Stopped from outside (bin/test's watchdog, past its limit): the example it hung in and where each
# thread was, before TERM's usual exit. Processes forked from here just exit.
SUITE_PID = Process.pid
Signal.trap("TERM") do
  if Process.pid == SUITE_PID
    example = RSpec.current_example
    warn "rspec: TERM in #{example ? "#{example.location} #{example.full_description}" : "no example"}"
    Thread.list.each { |thread| warn "#{thread.inspect}\n    #{Array(thread.backtrace).first(20).join("\n    ")}" }
  end
  raise SignalException, "TERM"
end

RSpec.configure do |config|
  config.include SpecHelpers
  config.disable_monkey_patching!
  config.order = :random
  config.expect_with(:rspec) { |c| c.syntax = :expect }
  config.filter_run_when_matching :focus
  # An example must never hang the suite (`timeout:` metadata for the few that build things).
  config.around { |example| Timeout.timeout(example.metadata.fetch(:timeout, 60)) { example.run } }
  config.before { reset_lock_manager! }
  config.after do
    @redis&.close
    shutdown_own_servers
  end
end
