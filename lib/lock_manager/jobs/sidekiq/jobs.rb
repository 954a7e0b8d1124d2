# frozen_string_literal: true

module LockManager
  module Sidekiq
    # What the middlewares know of a job: its class, options and lock. A job ActiveJob wraps is
    # known by its own class, arguments and job_id, never by the wrapper's.
    module Jobs
      module_function

      # The running job's lock, or nil for a job that uses neither `lock_with` nor
      # `set(lock_manager:)`, and for an ActiveJob class that includes LockManager::Worker (its
      # callbacks lock it).
      def job_lock(job, klass)
        klass = job_class(job, klass)
        return if callbacks?(klass)

        options = options_for(klass, job) or return
        build(job, klass, options)
      end

      # The throttle_with rules of the running job's class ([] for none, and for an ActiveJob class
      # that includes LockManager::Worker: its callbacks apply them).
      def throttles(klass)
        return [] if callbacks?(klass) || !klass.respond_to?(:lock_manager_throttles)

        klass.lock_manager_throttles
      end

      # The lock a job being pushed claims: nil unless its mode is unique. An ActiveJob class
      # that includes LockManager::Worker is claimed by its callbacks, but a push they did not
      # make (Rails 7.1's perform_all_later) is claimed here.
      def enqueue_lock(job, klass)
        klass, options = unique_options(job, klass)
        build(job, klass, options) if options
      end

      # [class, options] of a job being pushed whose mode is unique, else nil. The class may be
      # nil: a job pushed by name from elsewhere, locked by its set(lock_manager:) alone.
      def unique_options(job, klass)
        klass = job_class(job, klass)
        return if callbacks?(klass) && claimed_by_active_job?(job)

        options = options_for(klass, job)
        [klass, options] if options&.unique?
      end

      # The job's own class: a wrapped ActiveJob's, or the one its name gives when `klass` is not
      # a Class (a push by name).
      def job_class(job, klass)
        job["wrapped"] || !klass.is_a?(Class) ? constant(class_name(job)) : klass
      end

      # The lock of a job (a Sidekiq job Hash: "class", "wrapped", "args", "jid") of `klass`.
      def build(job, klass, options)
        args, token = arguments(job)
        key_proc = key_proc(klass)
        JobLock.new(options: options, class_name: class_name(job), args: proc_arguments(job, args, key_proc),
                    token: token, key_proc: key_proc, digest_args: args)
      end

      # A wrapped ActiveJob's Proc key sees its arguments as its callbacks do: deserialized.
      def proc_arguments(job, args, key_proc)
        return args unless key_proc && job["wrapped"] && defined?(::ActiveJob::Arguments)

        ::ActiveJob::Arguments.deserialize(args)
      end

      # The class's lock_with options, overridden by what the job carries (set(lock_manager: ...)).
      def options_for(klass, job)
        defaults = class_options(klass)
        return unless defaults || job["lock_manager"]

        CheckedJobOptions.fetch(defaults, job["lock_manager"])
      end

      def class_options(klass)
        return klass.lock_manager_options if klass.respond_to?(:lock_manager_options)

        klass.get_sidekiq_options["lock_manager"] if klass.respond_to?(:get_sidekiq_options)
      end

      def class_name(job)
        (job["wrapped"] || job["class"]).to_s
      end

      def arguments(job)
        return [job["args"], job["jid"]] unless job["wrapped"]

        data = job["args"].first
        [data["arguments"], data["job_id"]]
      end

      def key_proc(klass)
        klass.lock_manager_key if klass.respond_to?(:lock_manager_key)
      end

      # Whether ActiveJob's side claimed this push's lock (see ActiveJob::CLAIMED): a wrapped job's first
      # argument is its serialized data; a bulk's (push_bulk's items) is the first job's arguments.
      def claimed_by_active_job?(job)
        data = Array(job["args"]).first
        data = data.first if data.is_a?(Array)
        job["wrapped"] && LockManager::ActiveJob.claimed?(data)
      end

      # Whether ActiveJob's callbacks lock this class (LockManager::Worker in an ActiveJob class).
      def callbacks?(klass)
        klass.respond_to?(:lock_manager_callbacks?) && klass.lock_manager_callbacks?
      end

      # The class, when this process has it (a job pushed by name from elsewhere may be unknown).
      def constant(name)
        Object.const_get(name)
      rescue NameError
        nil
      end

      # Logs a push refused because `holder` holds the job's lock; tells listeners.
      # @return [nil] what a refused push returns
      def refused(lock, job, holder)
        why = " (on_conflict: :replace replaces only where Sidekiq's Redis is the locks')" if lock.options.replace?
        log("refused #{class_name(job)} jid=#{job["jid"]}: lock #{lock.key.inspect} " \
            "is held by #{holder_name(holder)}#{why}")
        Instrumentation.conflict(lock, class_name(job), job["jid"], refused_by: holder)
      end

      # How a line names a lock's holder: a job by its jid, anything else (a thread's token, taken with
      # Locker#blocking_lock, say) as it is.
      def holder_name(holder)
        holder.to_s.match?(/\A\h{24}\z/) ? "jid=#{holder}" : holder.to_s
      end

      # Logs a push that replaced the pending job `replaced` (on_conflict: :replace).
      def replaced(lock, job, replaced)
        log("replaced #{class_name(job)} jid=#{replaced} by jid=#{job["jid"]}: lock #{lock.key.inspect}")
      end

      def log(message)
        ::Sidekiq.logger.info("lock_manager: #{message}")
      end
    end
  end
end
