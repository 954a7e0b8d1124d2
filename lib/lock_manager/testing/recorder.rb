# frozen_string_literal: true

module LockManager
  module Testing
    # The keys code asked for while a block ran, from the gem's acquire events: in every mode (Redis
    # included) and from every thread, since the events fire wherever a Locker takes a lock.
    class Recorder
      # Records the acquire events of the block.
      # @return [Array(Recorder, Object)] the recording and the block's value
      def self.record
        recorder = new
        subscriber = LockManager.subscribe(Instrumentation::ACQUIRE) { |event| recorder.add(event.payload) }
        value = yield
        [recorder, value]
      ensure
        LockManager.unsubscribe(subscriber) if subscriber
      end

      def initialize
        @mutex = Mutex.new
        @taken = []
        @refused = []
      end

      # @api private
      def add(payload)
        @mutex.synchronize { (payload[:acquired] ? @taken : @refused) << payload[:key].to_s }
      end

      # @return [Array<String>] the keys acquired, each once, in the order first taken
      def taken
        @mutex.synchronize { @taken.uniq }
      end

      # @return [Array<String>] the keys asked for and not acquired (held by another, or a wait that ran out)
      def refused
        @mutex.synchronize { @refused.uniq }
      end

      # @param key [String, Symbol, Regexp]
      def taken?(key)
        taken.any? { |name| Recorder.match?(key, name) }
      end

      def refused?(key)
        refused.any? { |name| Recorder.match?(key, name) }
      end

      # What happened, for a failure message: `took "a" and "b"; asked for "c" but did not get it`.
      def summary
        took = taken.empty? ? "took no lock" : "took #{Recorder.list(taken)}"
        refused.empty? ? took : "#{took}; asked for #{Recorder.list(refused)} but did not get it"
      end

      def self.match?(expected, key)
        expected.is_a?(Regexp) ? expected.match?(key) : expected.to_s == key
      end

      def self.list(keys)
        quoted = keys.map(&:inspect)
        quoted.size > 1 ? "#{quoted[0..-2].join(", ")} and #{quoted.last}" : quoted.first
      end
    end
  end
end
