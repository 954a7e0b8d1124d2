# frozen_string_literal: true

require "active_job"
require_relative "../../lock_manager"
require_relative "options"
require_relative "job_lock"
require_relative "active_job/after_commit"
require_relative "active_job/bulk_enqueue"
require_relative "active_job/throttled"
require_relative "active_job/expiring"
require_relative "active_job/rescheduled"
require_relative "active_job/parking"

module LockManager
  # `include LockManager::Worker` in an ActiveJob class: the same `lock_with` as in a Sidekiq job,
  # applied through ActiveJob's own callbacks on any adapter (around_enqueue takes a unique job's
  # lock, around_perform runs the job under its strategy). The job's lock is held by its job_id,
  # which stays the same across retry_on and the adapter's retries.
  module ActiveJob
    # Marks the serialized job (a wrapped job's first argument) of a push whose lock ActiveJob's side claimed
    # already (its callbacks, perform_all_later): the Sidekiq middleware leaves that push alone. A job class's
    # own `serialize` that builds a new Hash drops the mark: the middleware then claims again, for the same
    # job_id, which holds it already (one more round trip, nothing refused).
    CLAIMED = :@lock_manager_claimed

    include Throttled
    include Expiring
    include Rescheduled
    include Parking

    def self.included(base)
      base.extend(ClassMethods)
      base.around_enqueue { |job, enqueue| job.send(:lock_manager_enqueue, &enqueue) }
      base.around_perform { |job, perform| job.send(:lock_manager_perform, &perform) }
      # ActiveJob 7.0+ has its own; 6.1 returns false from perform_later without saying more.
      base.attr_writer :successfully_enqueued unless base.method_defined?(:successfully_enqueued?)
      base.define_method(:successfully_enqueued?) { @successfully_enqueued == true } unless
        base.method_defined?(:successfully_enqueued?)
      install_perform_all_later
    end

    # ActiveJob.perform_all_later (7.1+), which runs no callbacks, claims the locks of unique jobs too.
    def self.install_perform_all_later
      return unless ::ActiveJob.respond_to?(:perform_all_later)

      ::ActiveJob.singleton_class.prepend(PerformAllLater) unless ::ActiveJob.singleton_class <= PerformAllLater
    end

    # Whether a wrapped job's serialized data comes from a push ActiveJob's side claimed.
    def self.claimed?(data)
      data.is_a?(Hash) && data.instance_variable_get(CLAIMED) == true
    end

    # When ActiveJob pushes the job at the commit (Rails 7.2, 8.0), its whole enqueue waits for the commit, as on
    # Rails 8.1: a unique job's lock is taken when it is pushed, and a rollback leaves none. perform_later returns
    # the job then, successfully_enqueued? true until the commit says otherwise (a duplicate is refused then).
    def enqueue(options = {})
      return super unless AfterCommit.push_deferred?(self)

      set(options)
      outcome = nil
      ran = false
      ::ActiveRecord.after_all_transactions_commit do
        ran = true
        outcome = super()
      end
      return outcome if ran # no transaction was open

      self.successfully_enqueued = true
      self
    end

    # ActiveJob's serialize, marked (CLAIMED) while the job is pushed with its lock claimed.
    def serialize
      data = super
      data.instance_variable_set(CLAIMED, true) if @lock_manager_pushing
      data
    end

    # Whether this job is being pushed with its lock claimed already.
    # @api private
    attr_writer :lock_manager_pushing

    # Class methods of an ActiveJob class that includes LockManager::Worker.
    module ClassMethods
      # Its locks come from its callbacks, not from the Sidekiq middleware.
      def lock_manager_callbacks?
        true
      end
    end

    # The lock this job claims when it is pushed: nil unless its mode is unique (its key is not even computed then),
    # and for :until_expired once its lock has expired.
    # @api private
    def lock_manager_enqueue_lock
      options = lock_manager_job_options
      lock_manager_expiring(lock_manager_lock(options)) if options&.unique?
    end

    # A refused push: the job is not enqueued, perform_later returns false.
    # @api private
    def lock_manager_refused(lock, holder)
      lock_manager_log("refused", lock.key, " by #{holder}")
      Instrumentation.conflict(lock, self.class.name, job_id, refused_by: holder)
      self.successfully_enqueued = false
    end

    private

    def lock_manager_job_options
      options = self.class.lock_manager_options
      CheckedJobOptions.fetch(options, nil) if options
    end

    def lock_manager_lock(options = lock_manager_job_options)
      options && JobLock.new(options: options, class_name: self.class.name, args: arguments, token: job_id,
                             key_proc: self.class.lock_manager_key,
                             digest_args: -> { ::ActiveJob::Arguments.serialize(arguments) })
    end

    # Only a unique job takes a lock at push.
    def lock_manager_enqueue(&block)
      lock = lock_manager_enqueue_lock or return yield

      holder = JobLock.claim([lock], [scheduled_at]).first
      holder ? lock_manager_refused(lock, holder) : lock_manager_push(lock, &block)
    end

    def lock_manager_log(what, key, held)
      logger&.info("lock_manager: #{what} #{self.class.name} job_id=#{job_id}: lock #{key.inspect} is held#{held}")
    end

    def lock_manager_push(lock)
      self.lock_manager_pushing = true
      yield
      self.successfully_enqueued = true
    rescue Exception # rubocop:disable Lint/RescueException -- a job not enqueued leaves no lock
      lock.abandon
      raise
    ensure
      self.lock_manager_pushing = false
    end

    def lock_manager_perform(&block)
      throttles = self.class.lock_manager_throttles
      return lock_manager_locked(&block) if throttles.empty?

      refusal = JobThrottle.run(throttles, self.class.name, job_id, arguments, @lock_manager_promises) do
        lock_manager_locked(&block)
      end
      lock_manager_throttled(refusal) if refusal
    end

    # @return [Boolean] whether the job ran (false: its lock was held)
    def lock_manager_locked(&block)
      lock = lock_manager_lock
      unless lock
        yield
        return true
      end

      # The adapter (or retry_on) may try again: a unique job's lock outlives the failure by unique_for.
      ran = lock.run(retry_in: ->(_error) { 0 }) { lock_manager_running(&block) }
      lock_manager_conflict(lock) unless ran
      ran
    end
  end
end
