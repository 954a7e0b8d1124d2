# frozen_string_literal: true

require_relative "../../lock_manager"
require_relative "options"
require_relative "throttle"

module LockManager
  # Locks a job, in Sidekiq (6.4, 7.x, 8.x) or in ActiveJob (any adapter):
  #
  #   class MyWorker
  #     include LockManager::Worker
  #     lock_with :nonblocking, key: ->(user_id, *) { "user:#{user_id}" }, on_conflict: :skip
  #   end
  #
  # In a plain class it also includes Sidekiq::Job and installs the Sidekiq middlewares; in an
  # ActiveJob class it locks through ActiveJob's callbacks instead (see LockManager::ActiveJob).
  module Worker
    def self.included(base)
      if defined?(::ActiveJob::Base) && base < ::ActiveJob::Base
        require_relative "active_job"
        base.include(LockManager::ActiveJob)
        require_relative "sidekiq" if defined?(::Sidekiq) # its pushes and Web UI deletes of this class
      else
        require_relative "sidekiq"
        base.include(::Sidekiq::Worker) unless base < ::Sidekiq::Worker
      end
      base.extend(ClassMethods)
    end

    # Class-level DSL of a locked job.
    module ClassMethods
      # @param mode [Symbol] :nonblocking (skip, reschedule or raise when held), :blocking (wait),
      #   or unique from push: :until_executing, :until_executed, :until_and_while_executing
      # @param options see JobOptions: key, timeout, on_conflict, reschedule_in, max_reschedules,
      #   when_exhausted, limit, renew, max_hold, unique_for
      # @raise [ArgumentError] at class load, naming the bad option
      def lock_with(mode = :nonblocking, **options)
        checked = JobOptions.new(options.merge(mode: mode))
        refuse_sidekiq_only(checked) if respond_to?(:lock_manager_callbacks?)
        keep_procs(checked)
        @lock_manager_options = checked.to_h.freeze
        return if respond_to?(:lock_manager_callbacks?)

        sidekiq_options("lock_manager" => checked.to_h)
        LockManager::Sidekiq.install # reaches Sidekiq 7 capsules that started before this class loaded
      end

      # The Procs lock_with was given, which cannot travel in a job's JSON: they stay on the class.
      def keep_procs(checked)
        @lock_manager_key = (checked.key if checked.key.is_a?(Proc))
        @lock_manager_reschedule_in = (checked.backoff.reschedule_in if checked.backoff.reschedule_in.is_a?(Proc))
      end

      # An ActiveJob class's pushes cannot replace a pending job: its enqueue claims the lock before
      # the adapter pushes, apart from the push.
      def refuse_sidekiq_only(checked)
        return unless checked.replace?

        raise ArgumentError, "lock_with on_conflict: :replace is for Sidekiq jobs (include LockManager::Worker " \
                             "in a Sidekiq job class): an ActiveJob class's lock is claimed apart from its push"
      end
      private :keep_procs, :refuse_sidekiq_only

      # Adds a rate or concurrency rule the job must pass when it starts (see JobThrottle): several
      # rules make all-or-none; a refused job runs again when the rule would admit it.
      # @param options [Hash] key:, on_limit:, and rate:/window:/sliding_window: with per: and
      #   burst:, or concurrency: with timeout: and reschedule_in:
      # @raise [ArgumentError] at class load, naming the bad option
      def throttle_with(**options)
        @lock_manager_throttles = (lock_manager_throttles + [JobThrottle.new(**options)]).freeze
        LockManager::Sidekiq.install unless respond_to?(:lock_manager_callbacks?)
      end

      # Releases the lock a job of this class with these arguments would take, whoever holds it
      # (Admin#release_job): `SyncUserJob.unlock(7)`.
      # @return [Boolean] whether there was one
      def unlock(*args)
        require_relative "../admin"
        LockManager::Admin.new.release_job(self, args)
      end

      # The lock a job of this class would take with `args`, made where its pushes and runs make
      # it: an ActiveJob's by its callbacks, a Sidekiq job's from its payload (the arguments as
      # JSON gives them back).
      # @return [JobLock, nil] nil without lock_with
      def lock_manager_lock_for(args)
        return unless lock_manager_options
        return new(*args).send(:lock_manager_lock) if respond_to?(:lock_manager_callbacks?)

        LockManager::Sidekiq::Jobs.job_lock({ "class" => name, "args" => JSON.parse(JSON.generate(args)) }, self)
      end

      # The rules of throttle_with, the superclass's first.
      def lock_manager_throttles
        return @lock_manager_throttles if defined?(@lock_manager_throttles)

        superclass.respond_to?(:lock_manager_throttles) ? superclass.lock_manager_throttles : [].freeze
      end

      # The options of lock_with (JSON-safe), or the superclass's.
      def lock_manager_options
        return @lock_manager_options if defined?(@lock_manager_options)

        superclass.respond_to?(:lock_manager_options) ? superclass.lock_manager_options : nil
      end

      # The Proc given as `key:`, if any (a Proc cannot travel in the job's JSON).
      def lock_manager_key
        return @lock_manager_key if defined?(@lock_manager_key)

        superclass.respond_to?(:lock_manager_key) ? superclass.lock_manager_key : nil
      end

      # The Proc given as `reschedule_in:`, if any (a Proc cannot travel in the job's JSON).
      def lock_manager_reschedule_in
        return @lock_manager_reschedule_in if defined?(@lock_manager_reschedule_in)

        superclass.respond_to?(:lock_manager_reschedule_in) ? superclass.lock_manager_reschedule_in : nil
      end
    end
  end

  Job = Worker
end
