# frozen_string_literal: true

require_relative "fake_limits/decision"
require_relative "fake_limits/gcra"
require_relative "fake_limits/window"
require_relative "fake_limits/sliding"

module LockManager
  module Testing
    # A limiter of `LockManager::Testing.fake!`: the decisions of lua/limit_*.lua, in process, on
    # a clock that `Testing.travel` moves (one class per script in fake_limits/).
    # spec/support/limiter_examples.rb runs the same behaviour against both, so the two cannot
    # drift apart. Counts in microseconds, as the scripts.
    class FakeLimiter
      # Each limiter's state by name and kind, shared as Redis's key is.
      STATES = Hash.new { |states, key| states[key] = {} }
      MUTEX = Mutex.new
      KINDS = { "gcra" => FakeLimits::Gcra, "window" => FakeLimits::Window, "sliding" => FakeLimits::Sliding }.freeze

      def self.reset!
        MUTEX.synchronize { STATES.clear }
      end

      def initialize(name, kind, amount, per, burst)
        @key = [name, kind]
        @kind = KINDS.fetch(kind.to_s)
        @rule = FakeLimits::Decision::Rule.new(amount, (per * 1_000_000).round, burst)
      end

      # @param promise [nil, true, Array] as Native::Limiter#decide: now; now or a promise; redeem
      # @return [Array(Boolean, Integer, Float, Float, Array)] as Native::Limiter#decide
      def decide(cost, wait, promise = nil)
        deadline = wait && (Testing.now_us + (wait * 1_000_000))
        loop do
          decision = MUTEX.synchronize { run(cost).decide(promise) }
          admitted, remaining, retry_us, reset_us, receipt = decision
          return [admitted, remaining, retry_us / 1e6, reset_us / 1e6, receipt] unless waits?(decision, deadline)

          promise = receipt if promise && receipt != FakeLimits::Decision::NONE # asked for after the wait
          sleep(retry_us / 1e6)
        end
      end

      # Takes back what an admitted decision took, as the scripts' "give" does.
      def give_back(cost, receipt)
        MUTEX.synchronize { run(cost).give_back(receipt) }
        nil
      end

      def reset
        MUTEX.synchronize { !STATES.delete(@key).nil? }
      end

      private

      def waits?(decision, deadline)
        !decision[0] && deadline && Testing.now_us + decision[2] <= deadline
      end

      def run(cost)
        @kind.new(@rule, STATES[@key], Testing.now_us, cost)
      end
    end
  end
end
