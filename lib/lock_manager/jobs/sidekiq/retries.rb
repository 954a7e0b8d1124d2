# frozen_string_literal: true

module LockManager
  module Sidekiq
    # When a failed job tries again, as Sidekiq's JobRetry decides it (6.4, 7.x and 8.x).
    module Retries
      DEFAULT_MAX_RETRIES = 25
      # Whether this Sidekiq knows `retry_for` (7.1+).
      RETRY_FOR = Gem::Version.new(::Sidekiq::VERSION) >= Gem::Version.new("7.1")

      module_function

      # @return [Numeric, nil] seconds until the job's next try at the latest, 0 for a job Sidekiq
      #   puts back in its queue (shutdown, an interrupted iteration), nil when it gets none (no
      #   retry left, retry: false, retry_for elapsed, sidekiq_retry_in said :discard or :kill)
      def seconds_to_next_try(klass, job, error)
        return 0 if caused_by?(error, "Sidekiq::Shutdown")

        seconds = retry_in(klass, job, error)
        # An interrupted iteration (Sidekiq 7.3+) is pushed back at once by Sidekiq's
        # InterruptHandler, with the same jid, whatever its retries; without that middleware it
        # fails as any error does.
        seconds || (0 if caused_by?(error, "Sidekiq::Job::Interrupted"))
      end

      # Seconds until Sidekiq's retry of a failed job is due at the latest, nil when none follows.
      def retry_in(klass, job, error)
        count = job["retry_count"] ? job["retry_count"] + 1 : 0
        return unless retries_left?(job, count)

        delay = custom_delay(klass, job, error, count)
        return if %i[discard kill].include?(delay)

        (delay || ((count**4) + 15)) + (10 * (count + 1)) # Sidekiq's jitter is below 10 * (count + 1)
      end

      # `retry_for` (Sidekiq 7.1+) ends the retries that many seconds after the first failure: on 7
      # as well as the count, on 8 instead of it.
      def retries_left?(job, count)
        return false unless job["retry"]

        within_count = count < max_retries(job["retry"])
        retry_for = job["retry_for"]
        return within_count unless retry_for.is_a?(Numeric) && RETRY_FOR

        within_time = first_failure(job) + retry_for >= Time.now.to_f
        ::Sidekiq::VERSION.to_i >= 8 ? within_time : within_count && within_time
      end

      # Epoch seconds of the job's first failure (this one when it is the first); Sidekiq 8 stores
      # milliseconds (an Integer), 7 seconds (a Float).
      def first_failure(job)
        at = job["failed_at"]
        return Time.now.to_f unless at.is_a?(Numeric)

        at.is_a?(Float) ? at : at / 1000.0
      end

      # What the class's sidekiq_retry_in says: seconds, :discard, :kill, or nil (the default).
      def custom_delay(klass, job, error, count)
        block = klass.sidekiq_retry_in_block if klass.respond_to?(:sidekiq_retry_in_block)
        delay = block&.call(count, error, job)
        delay.is_a?(Integer) && !delay.positive? ? nil : delay
      rescue StandardError
        nil # Sidekiq falls back to its default then
      end

      def max_retries(retry_option)
        return retry_option if retry_option.is_a?(Integer)

        config = ::Sidekiq.respond_to?(:default_configuration) ? ::Sidekiq.default_configuration : ::Sidekiq.options
        config[:max_retries] || DEFAULT_MAX_RETRIES
      end

      # Whether the error, or one that caused it, is of the class named (when this Sidekiq has it).
      def caused_by?(error, class_name)
        klass = Jobs.constant(class_name) or return false
        error = error.cause until error.nil? || error.is_a?(klass)
        !error.nil?
      end
    end
  end
end
