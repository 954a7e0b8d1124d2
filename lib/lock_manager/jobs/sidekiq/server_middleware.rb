# frozen_string_literal: true

module LockManager
  module Sidekiq
    # Runs jobs under their lock; passes every other job through untouched, at no Redis cost.
    # Holds no state between jobs (Sidekiq 6.4 builds one per job).
    class ServerMiddleware
      include ::Sidekiq::ServerMiddleware if defined?(::Sidekiq::ServerMiddleware)

      # @return what the rest of the chain returned, as every middleware does (perform_inline takes a
      #   falsy value for a job that did not run); nil when the job's lock was held
      def call(job_instance, job, _queue)
        lock = Jobs.job_lock(job, job_instance.class)
        return yield unless lock

        value = nil
        ran = lock.run(retry_in: ->(error) { Retries.seconds_to_next_try(job_instance.class, job, error) }) do
          value = yield
        end
        return value if ran

        conflict(job_instance, job, lock)
        nil
      end

      private

      def conflict(job_instance, job, lock)
        by = lock.holder ? " by jid=#{lock.holder}" : ""
        JobConflict.handle(lock, Jobs.class_name(job), job["jid"],
                           log: ->(what, key) { Jobs.log("#{what} #{about(job)}: lock #{key.inspect} is held#{by}") },
                           reschedule: ->(delay) { reschedule(job_instance, job, lock, delay) })
      end

      def reschedule(job_instance, job, lock, delay)
        jid = ::Sidekiq::Client.push(copy_of(job_instance, job, at: Time.now.to_f + delay))
        Jobs.log("rescheduled #{about(job)} in #{delay.round(1)}s as jid=#{jid}: lock #{lock.held_key.inspect} is held")
      end

      def about(job)
        "#{Jobs.class_name(job)} jid=#{job["jid"]}"
      end

      # The job pushed again for later. An iterable job (Sidekiq 7.3+) keeps its jid, under which
      # Sidekiq saved its cursor: an interrupted iteration goes on where it stopped.
      def copy_of(job_instance, job, at:)
        kept = %w[class wrapped args queue retry lock_manager]
        kept << "jid" if defined?(::Sidekiq::Job::Iterable) && job_instance.is_a?(::Sidekiq::Job::Iterable)
        job.slice(*kept).merge("at" => at)
      end
    end
  end
end
