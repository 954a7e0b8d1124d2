# frozen_string_literal: true

module LockManager
  module Testing
    # The in-process decisions of LockManager::Testing::FakeLimiter, one class per script.
    module FakeLimits
      # One decision of one limiter: its rule, its state (shared by every limiter of its name and
      # kind, as the script's key is), the time and the cost. Subclasses answer `decide(promise)`
      # (nil: now; true: now or a promise; a promise to redeem) and `give_back(receipt)` as
      # lua/limit_*.lua does, in the same shape.
      class Decision
        # The rule as its script receives it: the rate or limit, the period in µs, the burst.
        Rule = Struct.new(:amount, :per, :burst)
        NONE = [0, 0].freeze

        def initialize(rule, state, now, cost)
          @rule = rule
          @state = state
          @now = now
          @cost = cost
        end

        private

        attr_reader :rule, :state, :now, :cost

        def redeem?(promise)
          promise.is_a?(Array)
        end

        def left(used)
          [rule.amount - used, 0].max
        end
      end
    end
  end
end
