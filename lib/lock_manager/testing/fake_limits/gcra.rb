# frozen_string_literal: true

module LockManager
  module Testing
    module FakeLimits
      # lua/limit_gcra.lua. state: { tat:, line: } (the line: the TAT plus the units promised).
      class Gcra < Decision
        PROMISED = [1, 0].freeze

        def initialize(*)
          super
          @interval = rule.per.to_f / rule.amount
          @capacity = rule.burst * @interval
          @tat = [state[:tat] || now, now].max
          @line = [state[:line] || @tat, @tat].max
        end

        def decide(promise)
          return refusal(promise) if over?(redeem?(promise) ? @tat : @line)

          tat = (@tat + step).ceil
          line = redeem?(promise) ? [@line, tat].max : (@line + step).ceil
          state.replace(tat: tat, line: line)
          [true, units(line - now), 0, line - now, [tat, 0]]
        end

        # Back by what of the unit's span is still ahead: none once it has passed.
        def give_back(receipt)
          back = (receipt[0] - now).clamp(0, step)
          return unless state[:tat] && back.positive?

          state.replace(tat: (state[:tat] - back).ceil, line: ([state[:line], state[:tat]].max - back).ceil)
        end

        private

        def refusal(promise)
          remaining = units(@line - now)
          return [false, remaining, wait_for(@tat), (@line - now).ceil, PROMISED] if redeem?(promise)
          return [false, remaining, wait_for(@line), (@line - now).ceil, NONE] unless promise

          line = (@line + step).ceil
          state.replace(tat: @tat, line: line)
          [false, remaining, wait_for(line - step), line - now, PROMISED]
        end

        def step
          cost * @interval
        end

        def over?(at)
          at + step - now > @capacity + 1e-6
        end

        def wait_for(at)
          (at + step - now - @capacity).ceil
        end

        # The units that fit before a TAT `ahead` past now reaches the burst.
        def units(ahead)
          [(((@capacity - ahead) / @interval) + 1e-9).floor, 0].max
        end
      end
    end
  end
end
