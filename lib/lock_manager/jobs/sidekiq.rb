# frozen_string_literal: true

require "sidekiq"
require "sidekiq/api"
require_relative "../../lock_manager"
require_relative "options"
require_relative "job_lock"
require_relative "sidekiq/jobs"
require_relative "sidekiq/retries"
require_relative "sidekiq/client_middleware"
require_relative "sidekiq/one_push"
require_relative "sidekiq/parking"
require_relative "sidekiq/server_middleware"
require_relative "sidekiq/bulk_push"
require_relative "sidekiq/removed_jobs"
require_relative "sidekiq/deleted_jobs"
require_relative "sidekiq/killed_jobs"
require_relative "sidekiq/cleared_jobs"
require_relative "sidekiq/testing_runs"

module LockManager
  # The Sidekiq integration (6.4, 7.x and 8.x): `require "lock_manager/sidekiq"` (or
  # `include LockManager::Worker`) installs it.
  module Sidekiq
    # A capsule's own chains, where it has copied them already (nil otherwise: nothing to add to).
    CopiedChains = Struct.new(:capsule) do
      def client_middleware
        capsule.instance_variable_get(:@client_chain)
      end

      def server_middleware
        capsule.instance_variable_get(:@server_chain)
      end
    end

    class << self
      # Adds the middlewares to Sidekiq's chains: the configuration's, every Sidekiq 7 capsule's
      # (each copies the chains when its first job runs, so a class loaded later must reach them
      # too) and Sidekiq::Testing's (now, or when its first job runs: see TestingRuns). Idempotent:
      # every `lock_with` calls it.
      def install
        install_middlewares
        [BulkPush::Client, OnePush::Push].each do |push|
          ::Sidekiq::Client.prepend(push) unless ::Sidekiq::Client <= push
        end
        install_api
        ::Sidekiq::Job::ClassMethods.prepend(TestingRuns) unless ::Sidekiq::Job::ClassMethods <= TestingRuns
      end

      # The server middleware in the chain of Sidekiq's testing modes, once they are loaded.
      def install_testing
        return unless defined?(::Sidekiq::Testing) && ::Sidekiq::Testing.respond_to?(:server_middleware)

        ::Sidekiq::Testing.server_middleware { |chain| add(chain, ServerMiddleware) }
      end

      private

      # The API's ways to remove a pending job (a Web UI button calls one of them): each releases
      # the locks of the jobs it removes (RemovedJobs).
      def install_api
        [[::Sidekiq::JobRecord, :delete, DeletedJobs], [::Sidekiq::SortedEntry, :delete, DeletedJobs],
         [::Sidekiq::DeadSet, :kill, KilledJobs], [::Sidekiq::Queue, :clear, ClearedJobs::Queue],
         [::Sidekiq::JobSet, :clear, ClearedJobs::Set]].each do |api, method, releases|
          api.prepend(releases) unless api.instance_method(method).owner == releases
        end
      end

      def install_middlewares
        ::Sidekiq.configure_client { |config| add(config.client_middleware, ClientMiddleware) }
        # perform_inline runs a job in this process through the configuration's server chain, in a
        # client as in a server: a unique job's lock, claimed by its push, is released by its run.
        add(configuration.server_middleware, ServerMiddleware)
        ::Sidekiq.configure_server do |config|
          chains(config).each do |holder|
            add(holder.client_middleware, ClientMiddleware)
            add(holder.server_middleware, ServerMiddleware)
          end
        end
        install_testing
      end

      # The configuration, and the Sidekiq 7 capsules that already copied its chains. A capsule
      # that has not is left alone: reading its chain would copy it now, and middleware the app
      # adds later would never reach it (a capsule copies once).
      def chains(config)
        config = ::Sidekiq if config.is_a?(Hash) # 6.4 yields its options Hash; its chains hang off Sidekiq
        capsules = config.respond_to?(:capsules) ? config.capsules.values : []
        [config, *capsules.map { |capsule| CopiedChains.new(capsule) }]
      end

      # Sidekiq 7 and 8's default configuration; 6.4 keeps its chains on Sidekiq itself.
      def configuration
        ::Sidekiq.respond_to?(:default_configuration) ? ::Sidekiq.default_configuration : ::Sidekiq
      end

      def add(chain, middleware)
        chain.add(middleware) unless chain.nil? || chain.exists?(middleware)
      end
    end
  end
end

LockManager::Sidekiq.install
