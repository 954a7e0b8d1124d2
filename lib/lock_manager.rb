# frozen_string_literal: true

require_relative "lock_manager/version"
require_relative "lock_manager/errors"
require_relative "lock_manager/arguments"
require_relative "lock_manager/topology_arguments"
require_relative "lock_manager/configuration"
require_relative "lock_manager/result"
require_relative "lock_manager/lock"
require_relative "lock_manager/reports"
# The native library defines LockManager::Native and looks up the error classes above.
require "lock_manager/lock_manager"
require_relative "lock_manager/locker"

# Distributed locks on Redis, with a Rust core.
module LockManager
  # Loaded on first use: only Sidekiq apps need Sidekiq, only Rails apps the helper.
  autoload :JobOptions, "lock_manager/job_options"
  autoload :Lockable, "lock_manager/lockable"
  autoload :Sidekiq, "lock_manager/sidekiq"
  autoload :Worker, "lock_manager/worker"

  @config = Configuration.new
  @locker = nil
  @locker_mutex = Mutex.new

  class << self
    # The current settings (redis_url shown without its password).
    attr_reader :config

    # Changes the settings; the shared Locker is rebuilt with them on next use.
    # @raise [ArgumentError] when a setting is invalid (nothing is changed then)
    def configure
      @locker_mutex.synchronize do
        draft = @config.dup
        yield draft
        draft.locker_options
        @config = draft
        @locker = nil
      end
      config
    end

    # The Locker behind LockManager::Locker.nonblocking_lock / blocking_lock.
    def locker
      @locker || @locker_mutex.synchronize { @locker ||= Locker.new(**@config.locker_options) }
    end

    def logger
      config.logger
    end
  end
end
