# frozen_string_literal: true

module LockManager
  # The renewal thread's renewals and the losses it finds, as renew.lock_manager and
  # lost.lock_manager events when they happen. The extension keeps them once someone listens to
  # either event and a renewed lock is taken; a thread of this process (again in a forked child)
  # takes them, waiting without the GVL, and emits them.
  module LeaseEvents
    NAMES = [Instrumentation::RENEW, Instrumentation::LOST].freeze

    @pid = nil
    @mutex = Mutex.new

    class << self
      # Called as a renewed lock is taken: starts the thread if someone listens. One check when
      # it runs already.
      def watch
        return if NAMES.none? { |name| Events.on?(name) } || watching?

        @mutex.synchronize do
          next if watching?

          Native.listen_to_leases
          thread = Thread.new { emit_forever }
          thread.name = "lock_manager-events"
          thread.report_on_exception = false
          @pid = Process.pid
        end
      end

      # Whether this process emits renewals and losses as they happen (then a block's release
      # does not report a loss its renewal already did).
      def watching?
        @pid == Process.pid
      end

      private

      def emit_forever
        loop do
          Native.lease_events(1.0).each do |kind, key, seconds, cause|
            if kind == :renewed
              Instrumentation.renewed(key, seconds, true)
            else
              Instrumentation.lost_by_renewal(key, seconds, cause)
            end
          end
        end
      end
    end
  end
end
