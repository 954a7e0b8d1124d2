# frozen_string_literal: true

module LockManager
  module ActiveJob
    # ActiveJob.perform_all_later (ActiveJob 7.1+) runs no enqueue callbacks: prepended to ActiveJob's singleton
    # class, this claims the locks of the unique jobs first, whatever the adapter, and pushes the others.
    module PerformAllLater
      def perform_all_later(*jobs)
        later, now = BulkEnqueue.split(jobs.flatten)
        BulkEnqueue.new(now).push { |group| super(group) } if now.any?
        ::ActiveRecord.after_all_transactions_commit { BulkEnqueue.new(later).push { |group| super(group) } } if
          later.any?
        nil
      end
    end

    # One perform_all_later's jobs: every unique job's lock claimed in one round trip per BATCH jobs (of any
    # classes), the refused ones dropped, and each job's successfully_enqueued? set, true or false (Sidekiq's
    # enqueue_all sets none). A job that is not pushed leaves no lock.
    class BulkEnqueue
      BATCH = 1_000

      # [the jobs ActiveJob.perform_all_later pushes at the commit (Rails 8.1, enqueue_after_transaction_commit),
      # the others]: those are claimed at the commit too.
      def self.split(jobs)
        return [[], jobs] unless deferred_by_rails?

        jobs.partition { |job| job.class.enqueue_after_transaction_commit }
      end

      def self.deferred_by_rails?
        ::ActiveJob.respond_to?(:_perform_all_later_skip_transaction, true) ||
          (defined?(::ActiveJob::EnqueueAfterTransactionCommit::ActiveJobMethods) &&
            ::ActiveJob.singleton_class.include?(::ActiveJob::EnqueueAfterTransactionCommit::ActiveJobMethods))
      end

      def initialize(jobs)
        @jobs = jobs
        @locks = {}.compare_by_identity
        jobs.each do |job|
          lock = job.lock_manager_enqueue_lock if job.respond_to?(:lock_manager_enqueue_lock)
          @locks[job] = lock if lock
        end
      end

      # Yields the jobs to push, a group per adapter (as perform_all_later groups them).
      def push(&block)
        groups = claim.group_by(&:queue_adapter).values
        groups.each_with_index do |group, index|
          pushing(group) { push_group(group, &block) }
        rescue Exception # rubocop:disable Lint/RescueException -- jobs not pushed leave no lock
          groups.drop(index).flatten.each { |job| unpushed(job) unless job.successfully_enqueued? }
          raise
        end
      end

      private

      # Runs the block as the push of `group`, whose jobs' locks were claimed (see ActiveJob::CLAIMED).
      def pushing(group)
        claimed = group.select { |job| @locks.key?(job) }
        claimed.each { |job| job.lock_manager_pushing = true }
        yield
      ensure
        claimed&.each { |job| job.lock_manager_pushing = false }
      end

      # ActiveJob's own loop sets each job's successfully_enqueued; an adapter's enqueue_all (Sidekiq's) pushes
      # all of them or raises.
      def push_group(group)
        group.each { |job| job.successfully_enqueued = false }
        yield group
        group.each { |job| job.successfully_enqueued = true } if group.first.queue_adapter.respond_to?(:enqueue_all)
        group.each { |job| unpushed(job) unless job.successfully_enqueued? }
      end

      def unpushed(job)
        job.successfully_enqueued = false
        @locks[job]&.abandon
      end

      # @return [Array] the jobs to push: all but those whose lock another holds (logged, false)
      def claim
        holders = claim_batches
        refused = @locks.keys.zip(holders).select { |_, holder| holder }.to_h.compare_by_identity
        refused.each { |job, holder| job.lock_manager_refused(@locks[job], holder) }
        @jobs.reject { |job| refused.key?(job) }
      end

      def claim_batches
        holders = []
        @locks.keys.each_slice(BATCH) do |jobs|
          holders.concat(JobLock.claim(jobs.map { |job| @locks[job] }, jobs.map(&:scheduled_at)))
        end
        holders
      rescue Exception # rubocop:disable Lint/RescueException -- the batches claimed before leave no lock
        @locks.values.first(holders.size).zip(holders) { |lock, holder| lock.abandon unless holder }
        raise
      end
    end
  end
end
