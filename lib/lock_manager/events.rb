# frozen_string_literal: true

module LockManager
  # One thing a lock did, as subscribers receive it.
  Event = Struct.new(:name, :payload, :time, :end) do
    # @return [Float] milliseconds between time and end (0 for an instant)
    def duration
      (self.end - time) * 1000.0
    end
  end

  # What the gem instruments: acquire, release, renew, lost, conflict and throttle, each ".lock_manager".
  # Subscribers of LockManager.subscribe get every event; with ActiveSupport loaded,
  # ActiveSupport::Notifications does too. With nobody listening to an event, `on?` is false for
  # it and the lock calls build no payload for it (see bench/events.rb).
  module Events
    NAMES = %w[acquire release renew lost conflict throttle].map { |name| "#{name}.lock_manager" }.freeze

    # A LockManager.subscribe block and the events it wants.
    Subscriber = Struct.new(:pattern, :block) do
      def wants?(name)
        pattern.nil? || pattern === name # rubocop:disable Style/CaseEquality -- a String or a Regexp
      end
    end

    @subscribers = [].freeze # replaced, never changed: emitters iterate without a lock
    @mutex = Mutex.new

    class << self
      # @param name [String, Regexp, nil] the events wanted (nil: all)
      # @return [Subscriber] for #unsubscribe
      def subscribe(name = nil, &block)
        raise ArgumentError, "subscribe needs a block" unless block
        unless name.nil? || name.is_a?(Regexp) || NAMES.include?(name)
          raise ArgumentError, "unknown event #{name.inspect}: one of #{NAMES.join(", ")}, a Regexp, or nil"
        end

        subscriber = Subscriber.new(name, block)
        @mutex.synchronize { @subscribers = (@subscribers + [subscriber]).freeze }
        subscriber
      end

      def unsubscribe(subscriber)
        @mutex.synchronize { @subscribers = (@subscribers - [subscriber]).freeze }
        nil
      end

      # Whether anyone listens to `name`: the only question a lock call asks when nobody does.
      def on?(name)
        # No block call when there is no subscriber (every lock cycle asks twice).
        (!@subscribers.empty? && @subscribers.any? { |subscriber| subscriber.wants?(name) }) ||
          notifications_listening?(name)
      end

      # Sends one event to every subscriber that wants it, then to ActiveSupport::Notifications. A
      # subscriber that raises is logged: it cannot break the lock call that emitted the event.
      def emit(name, payload, started = nil)
        finished = Process.clock_gettime(Process::CLOCK_MONOTONIC)
        event = Event.new(name, payload.freeze, started || finished, finished)
        @subscribers.each { |subscriber| deliver(subscriber, event) if subscriber.wants?(name) }
        instrument(name, payload) if notifications_listening?(name)
        nil
      end

      private

      def deliver(subscriber, event)
        subscriber.block.call(event)
      rescue StandardError => e
        LockManager.logger&.error("lock_manager: a subscriber of #{event.name} raised #{e.class}: #{e.message}")
      end

      def notifications_listening?(name)
        defined?(::ActiveSupport::Notifications) && ::ActiveSupport::Notifications.notifier.listening?(name)
      end

      def instrument(name, payload)
        ::ActiveSupport::Notifications.instrument(name, payload)
      rescue StandardError => e
        LockManager.logger&.error("lock_manager: a subscriber of #{name} raised #{e.class}: #{e.message}")
      end
    end
  end
end
