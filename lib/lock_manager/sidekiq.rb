# frozen_string_literal: true

require "sidekiq"
require_relative "../lock_manager"
require_relative "job_options"

module LockManager
  # The Sidekiq integration: `require "lock_manager/sidekiq"` (or `include LockManager::Worker`).
  module Sidekiq
    # Runs jobs that use `lock_with` under their lock; passes every other job through untouched,
    # at no Redis cost. Holds no state between jobs (Sidekiq 6.4 builds one per job).
    class ServerMiddleware
      include ::Sidekiq::ServerMiddleware if defined?(::Sidekiq::ServerMiddleware)

      def call(job_instance, job, _queue, &block)
        options = options_for(job_instance.class, job)
        return yield unless options

        key = lock_key(job_instance.class, job, options)
        return LockManager::Locker.blocking_lock(key, **options.lock_options, &block) if options.blocking?

        result = LockManager::Locker.nonblocking_lock(key, **options.lock_options, &block)
        conflict(job, key, options) unless result.run?
        result.result
      end

      private

      # The class's lock_with options, overridden by what the job carries (set(lock_manager: ...));
      # nil for a job that uses neither. The class counts even for jobs pushed by class name.
      def options_for(klass, job)
        defaults = klass.respond_to?(:get_sidekiq_options) ? klass.get_sidekiq_options["lock_manager"] : nil
        return unless defaults || job["lock_manager"]

        JobOptions.new((defaults || {}).merge(job["lock_manager"] || {}))
      end

      # The lock key: set(lock_manager: { key: }) wins, then lock_with's String or Proc, then the class name.
      def lock_key(klass, job, options)
        return options.key if options.key.is_a?(String)

        proc = klass.respond_to?(:lock_manager_key) ? klass.lock_manager_key : nil
        proc ? proc.call(*job["args"]).to_s : job["class"].to_s
      end

      def conflict(job, key, options)
        case options.on_conflict
        when "skip"
          ::Sidekiq.logger.info("lock_manager: skipped #{job["class"]} jid=#{job["jid"]}: lock #{key.inspect} is held")
        when "reschedule"
          reschedule(job, key, options.reschedule_in)
        else
          raise LockManager::LockNotAcquired, key
        end
      end

      def reschedule(job, key, seconds)
        delay = seconds + (rand * seconds / 4) # jitter: rescheduled jobs do not all come back at once
        copy = job.slice("class", "args", "queue", "retry", "lock_manager").merge("at" => Time.now.to_f + delay)
        jid = ::Sidekiq::Client.push(copy)
        ::Sidekiq.logger.info("lock_manager: rescheduled #{job["class"]} jid=#{job["jid"]} in #{delay.round(1)}s " \
                              "as jid=#{jid}: lock #{key.inspect} is held")
      end
    end

    # Adds the middleware to Sidekiq's server chain (idempotent; only in the server process).
    def self.install
      ::Sidekiq.configure_server do |config|
        config.server_middleware do |chain|
          chain.add(ServerMiddleware) unless chain.exists?(ServerMiddleware)
        end
      end
    end
  end
end

LockManager::Sidekiq.install
