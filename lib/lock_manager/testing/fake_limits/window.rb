# frozen_string_literal: true

module LockManager
  module Testing
    module FakeLimits
      # lua/limit_window.lua. state: { window number => units counted in it }, from the current
      # window to the last promised.
      class Window < Decision
        def initialize(*)
          super
          @window = now / rule.per
          state.delete_if { |counted, _| counted < @window }
          @high = [*state.keys, @window].max
          @used = state.fetch(@window, 0)
        end

        def decide(promise)
          promised = redeem?(promise) ? promise[0] : 0
          return [promised == @window, left(@used), wait(promised), reset, [promised, 0]] if promised >= @window
          return admit if @used + cost <= rule.amount
          return promise_later if promise

          [false, left(@used), starts(room_from(@window + 1)), reset, NONE]
        end

        def give_back(receipt)
          counted = receipt[0] >= @window ? state.fetch(receipt[0], 0) : 0
          state[receipt[0]] = [counted - cost, 0].max if counted.positive?
        end

        private

        def admit
          state[@window] = @used + cost
          [true, rule.amount - @used - cost, 0, reset, [@window, 0]]
        end

        # Windows up to the last promised were filled in order: the promise goes to it, or the next.
        def promise_later
          target = [@high, @window + 1].max
          target += 1 if state.fetch(target, 0) + cost > rule.amount
          state[target] = state.fetch(target, 0) + cost
          [false, left(@used), starts(target), starts(target + 1), [target, 0]]
        end

        # Until a redeem's window starts (none for the current one).
        def wait(promised)
          promised > @window ? starts(promised) : 0
        end

        # Until the last window counted ends.
        def reset
          starts(@high + 1)
        end

        def room_from(window)
          window += 1 while window <= @high && state.fetch(window, 0) + cost > rule.amount
          window
        end

        def starts(window)
          (window * rule.per) - now
        end
      end
    end
  end
end
