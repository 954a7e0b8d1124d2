# frozen_string_literal: true

module LockManager
  module Sidekiq
    # When a failed job tries again, as Sidekiq's JobRetry decides it (6.4 and 7.x).
    module Retries
      DEFAULT_MAX_RETRIES = 25

      module_function

      # @return [Numeric, nil] seconds until the job's next try at the latest, 0 for a job Sidekiq
      #   puts back in its queue (shutdown), nil when it gets none (no retry left, retry: false,
      #   sidekiq_retry_in said :discard or :kill)
      def seconds_to_next_try(klass, job, error)
        return 0 if shutdown?(error)

        count = job["retry_count"] ? job["retry_count"] + 1 : 0
        return unless count < max_retries(job["retry"])

        delay = custom_delay(klass, job, error, count)
        return if %i[discard kill].include?(delay)

        (delay || ((count**4) + 15)) + (10 * (count + 1)) # Sidekiq's jitter is below 10 * (count + 1)
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
        return 0 unless retry_option

        config = ::Sidekiq.respond_to?(:default_configuration) ? ::Sidekiq.default_configuration : ::Sidekiq.options
        config[:max_retries] || DEFAULT_MAX_RETRIES
      end

      def shutdown?(error)
        while error
          return true if defined?(::Sidekiq::Shutdown) && error.is_a?(::Sidekiq::Shutdown)

          error = error.cause
        end
        false
      end
    end
  end
end
