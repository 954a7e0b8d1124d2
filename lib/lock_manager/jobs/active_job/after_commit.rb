# frozen_string_literal: true

module LockManager
  module ActiveJob
    # enqueue_after_transaction_commit (Rails 7.2+): when ActiveJob pushes a job at the commit.
    module AfterCommit
      RAILS_8_0 = Gem::Version.new("8.0")
      RAILS_8_1 = Gem::Version.new("8.1")

      # Whether ActiveJob pushes this job when the transaction it is enqueued in commits, but runs its enqueue
      # callbacks now: Rails 7.2 and 8.0 (enqueue_after_transaction_commit; 7.2's `:default` and any other value ask
      # the adapter, 8.0's `:default` is false). Rails 8.1 defers the callbacks with the push.
      def self.push_deferred?(job)
        return false unless defined?(::ActiveJob::EnqueueAfterTransactionCommit) &&
                            job.is_a?(::ActiveJob::EnqueueAfterTransactionCommit) && ::ActiveJob.gem_version < RAILS_8_1

        case (setting = job.class.enqueue_after_transaction_commit)
        when :always then true
        when :never then false
        else
          return job.queue_adapter.enqueue_after_transaction_commit? if ::ActiveJob.gem_version < RAILS_8_0

          [nil, false, :default].none?(setting)
        end
      end
    end
  end
end
