# frozen_string_literal: true

require "rails/railtie"
require "active_support/core_ext/class/subclasses"
# lib/lock_manager.rb requires this file as its last line when Rails is loaded; required on its own (after
# Rails, in a script), it loads the gem first.
require_relative "../../lock_manager" unless defined?(LockManager::Locker)

module LockManager
  # Rails integration, loaded only when Rails is (lib/lock_manager.rb requires it if Rails::Railtie is defined):
  #
  # - `config.lock_manager`: every setting of LockManager.configure, applied at boot; an unknown or bad one
  #   fails the boot with the ArgumentError LockManager.configure raises, naming it;
  # - the logger: Rails.logger tagged "[lock_manager]", unless the app sets `config.lock_manager.logger`;
  # - `rescue_responses`: a lock still held at the end of a wait is 409 Conflict, Redis unreachable 503;
  # - rake tasks: the `lock_manager` command's, with the app's settings (`bin/rails "lock_manager:list[report:*]"`).
  #
  # An app's own `LockManager.configure` in config/initializers runs after this one and wins.
  class Railtie < ::Rails::Railtie
    # What a controller's uncaught lock error becomes (ActionDispatch looks a class up by its exact name,
    # not its ancestors: every subclass is listed). 503 for what is transient (Redis unreachable, slow,
    # restarting, failing over, out of connections or memory, too few replicas): a retry later may succeed.
    # Misconfiguration (ClusterError, AuthenticationError, PermissionError), AlreadyHeld and LockLost stay
    # 500: a retry cannot help, and someone must look.
    def self.rescue_responses
      unavailable = [ConnectionError, *ConnectionError.descendants, PoolTimeout, NotReplicated, OutOfMemoryError]
      { LockNotAcquired.name => :conflict }.merge(unavailable.to_h { |error| [error.name, :service_unavailable] })
    end

    # The setting besides Configuration::SETTINGS (those locker_options checks).
    OTHER_SETTINGS = %i[logger].freeze

    config.lock_manager = ActiveSupport::OrderedOptions.new

    # Before ActionDispatch copies config.action_dispatch.rescue_responses (whatever order the gems were
    # required in); a mapping the app set itself is kept.
    initializer "lock_manager.rescue_responses", before: "action_dispatch.configure" do |app|
      next unless app.config.respond_to?(:action_dispatch)

      app.config.action_dispatch.rescue_responses.merge!(Railtie.rescue_responses) { |_, own, _| own }
    end

    # After Rails.logger exists (Rails' bootstrap), before the app's config/initializers.
    initializer "lock_manager.configure" do |app|
      Railtie.configure(app.config.lock_manager)
    end

    # The arguments of each of the command's tasks; options follow them: "lock_manager:release[report:1,--yes]".
    TASKS = { "list" => [:pattern], "show" => [:key], "release" => [:key], "watch" => [:pattern],
              "parked" => [:key], "delete-parked" => %i[key jid], "limiters" => [:pattern],
              "reset-limiter" => [:name] }.freeze

    # `bin/rails lock_manager:list` and the others: exe/lock_manager's commands on the app's own settings (as
    # config.lock_manager and config/initializers left them), which the command alone cannot see.
    rake_tasks do
      namespace :lock_manager do
        TASKS.each do |command, arguments|
          desc "lock_manager #{command} on this app's settings; options follow the #{arguments.last} " \
               "(lock_manager --help)"
          task command, arguments => :environment do |_, args|
            status = Railtie.run_command(command, args.to_a)
            exit(status) unless status.zero?
          end
        end
      end
    end

    # @return [Integer] the command's exit status
    def self.run_command(command, args)
      require_relative "../cli"
      CLI.new([command, *args], settings: LockManager.config.locker_options).run
    end

    # @param options [ActiveSupport::OrderedOptions] config.lock_manager
    # @raise [ArgumentError] naming an unknown or bad setting
    def self.configure(options)
      settings = known(options.to_h.transform_keys(&:to_sym))
      LockManager.configure do |c|
        c.logger = settings.fetch(:logger) { tagged_logger }
        settings.except(:logger).each { |name, value| c.public_send(:"#{name}=", value) }
      end
    end

    # @raise [ArgumentError] naming the settings LockManager.configure does not have
    def self.known(settings)
      unknown = settings.keys - Configuration::SETTINGS - OTHER_SETTINGS
      return settings if unknown.empty?

      raise ArgumentError, "unknown option#{"s" if unknown.size > 1}: #{unknown.join(", ")} (config.lock_manager)"
    end

    # Rails.logger with the tag "lock_manager" on every line (Rails 6.1: `tagged` without a block gives a
    # logger of its own; Rails.logger itself is not changed). An untagged Rails.logger is wrapped first.
    def self.tagged_logger
      logger = ::Rails.logger
      return LockManager.logger unless logger

      logger = ActiveSupport::TaggedLogging.new(logger) unless logger.respond_to?(:tagged)
      logger.tagged("lock_manager")
    end
  end
end
