# frozen_string_literal: true

require_relative "lock_manager/version"
require_relative "lock_manager/errors"
require_relative "lock_manager/arguments"
require_relative "lock_manager/arguments/topology"
require_relative "lock_manager/arguments/tls"
require_relative "lock_manager/arguments/tls_material"
require_relative "lock_manager/configuration"
require_relative "lock_manager/result"
require_relative "lock_manager/lock"
require_relative "lock_manager/reports"
require_relative "lock_manager/events"
require_relative "lock_manager/instrumentation"
# The native library defines LockManager::Native and looks up the error classes above. A checkout
# and the precompiled gem (x86_64-linux) hold one per Ruby, in lock_manager/<major.minor>/; the source
# gem compiles one at install time, which RubyGems puts on the load path as lock_manager/lock_manager.
ruby_abi = RUBY_VERSION[/\A\d+\.\d+/]
native = "lock_manager/#{ruby_abi}/lock_manager"
if File.exist?(File.join(__dir__, "#{native}.#{RbConfig::CONFIG["DLEXT"]}"))
  require_relative native
else
  begin
    require "lock_manager/lock_manager"
  rescue LoadError
    carried = Dir[File.join(__dir__, "lock_manager", "*", "lock_manager.#{RbConfig::CONFIG["DLEXT"]}")]
              .map { |path| File.basename(File.dirname(path)) }.sort_by { |abi| abi.split(".").map(&:to_i) }
    raise if carried.empty? # a source gem or a checkout with no build: RubyGems' own message

    # Not chained to the LoadError above (nor to RubyGems' own): this message says all there is.
    raise LoadError, <<~MSG, cause: nil
      lock_manager #{LockManager::VERSION} is precompiled for Ruby #{carried.join(", ")}, not for this Ruby #{RUBY_VERSION}
      Install the source gem instead, which compiles the extension (it needs Rust's cargo 1.88 or newer, and libclang):
        gem install lock_manager --platform ruby
        or with Bundler: gem "lock_manager", force_ruby_platform: true (or: bundle config set force_ruby_platform true)
      In a checkout of lock_manager: bundle exec rake compile
    MSG
  end
end
require_relative "lock_manager/lease_events"
require_relative "lock_manager/claims"
require_relative "lock_manager/block_calls"
require_relative "lock_manager/locker"
require_relative "lock_manager/limiter"
require_relative "lock_manager/limits/concurrency_limiter"

# Distributed locks on Redis, with a Rust core.
module LockManager
  # Loaded on first use: only Sidekiq apps need Sidekiq, only Rails apps the helper.
  autoload :ActiveJob, "lock_manager/jobs/active_job"
  autoload :Admin, "lock_manager/admin"
  autoload :CLI, "lock_manager/cli"
  autoload :Job, "lock_manager/jobs/worker"
  autoload :JobLock, "lock_manager/jobs/job_lock"
  autoload :JobOptions, "lock_manager/jobs/options"
  autoload :CheckedJobOptions, "lock_manager/jobs/options"
  autoload :Lockable, "lock_manager/rails/lockable"
  autoload :OnRedisError, "lock_manager/jobs/on_redis_error"
  autoload :Sidekiq, "lock_manager/jobs/sidekiq"
  autoload :Testing, "lock_manager/testing"
  autoload :Worker, "lock_manager/jobs/worker"

  @config = Configuration.new
  @locker = nil
  @locker_mutex = Mutex.new
  @testing_backend = nil

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

    # Calls the block with each LockManager::Event named `name` (a String or Regexp; nil: all of
    # them). ActiveSupport::Notifications subscribers get the same events when it is loaded.
    # @return [Events::Subscriber] for #unsubscribe
    def subscribe(name = nil, &block)
      Events.subscribe(name, &block)
    end

    def unsubscribe(subscriber)
      Events.unsubscribe(subscriber)
    end

    # The in-process backend every Locker uses while LockManager::Testing is on (nil: Redis).
    # @api private
    attr_accessor :testing_backend
  end
end

require_relative "lock_manager/rails/railtie" if defined?(Rails::Railtie)
