# frozen_string_literal: true

require "sidekiq"
require_relative "../lock_manager"
require_relative "sidekiq"

module LockManager
  # Locks a Sidekiq job while it runs:
  #
  #   class MyWorker
  #     include LockManager::Worker
  #     lock_with :nonblocking, key: ->(user_id, *) { "user:#{user_id}" }, on_conflict: :skip
  #   end
  #
  # Including it also makes the class a Sidekiq job, and registers the server middleware.
  module Worker
    def self.included(base)
      base.include(::Sidekiq::Worker) unless base < ::Sidekiq::Worker
      base.extend(ClassMethods)
    end

    # Class-level DSL of a locked job.
    module ClassMethods
      # @param mode [Symbol] :nonblocking (skip, reschedule or raise when held) or :blocking (wait)
      # @param options see JobOptions: key, timeout, on_conflict, reschedule_in, limit, renew, max_hold
      # @raise [ArgumentError] at class load, naming the bad option
      def lock_with(mode = :nonblocking, **options)
        checked = JobOptions.new(options.merge(mode: mode))
        @lock_manager_key = checked.key if checked.key.is_a?(Proc)
        sidekiq_options("lock_manager" => checked.to_h)
      end

      # The Proc given as `key:`, if any (a Proc cannot travel in the job's JSON).
      def lock_manager_key
        return @lock_manager_key if defined?(@lock_manager_key)

        superclass.respond_to?(:lock_manager_key) ? superclass.lock_manager_key : nil
      end
    end
  end
end
