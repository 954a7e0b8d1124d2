# frozen_string_literal: true

module LockManager
  module Testing
    # A limiter of `LockManager::Testing.fake!`: the decisions of lua/limit_*.lua, in process, on
    # a clock that `Testing.travel` moves. spec/support/limiter_examples.rb runs the same
    # behaviour against both, so the two cannot drift apart. Counts in microseconds, as the scripts.
    class FakeLimiter
      # Each limiter's state by name and kind, shared as Redis's key is.
      STATES = Hash.new { |states, key| states[key] = [] }
      MUTEX = Mutex.new
      NO_RECEIPT = [0, 0].freeze

      def self.reset!
        MUTEX.synchronize { STATES.clear }
      end

      def initialize(name, kind, amount, per, burst)
        @key = [name, kind]
        @kind = kind.to_sym
        @amount = amount
        @per = (per * 1_000_000).round
        @burst = burst
        @interval = @per.to_f / amount # GCRA's
        @capacity = burst * @interval
      end

      # @return [Array(Boolean, Integer, Float, Float)] as Native::Limiter#decide
      def decide(cost, wait)
        deadline = wait && (Testing.now_us + (wait * 1_000_000))
        loop do
          admitted, remaining, retry_us, reset_us, receipt = MUTEX.synchronize do
            send(@kind, STATES[@key], Testing.now_us, cost)
          end
          if admitted || deadline.nil? || Testing.now_us + retry_us > deadline
            return [admitted, remaining, retry_us / 1_000_000.0, reset_us / 1_000_000.0, receipt]
          end

          sleep(retry_us / 1_000_000.0)
        end
      end

      # Takes back what an admitted decision took, as the scripts' "give" does.
      def give_back(cost, receipt)
        MUTEX.synchronize { send(:"give_back_#{@kind}", STATES[@key], cost, receipt) }
        nil
      end

      def reset
        MUTEX.synchronize { !STATES.delete(@key).nil? }
      end

      private

      # state: [theoretical arrival time]
      def gcra(state, now, cost)
        ahead = [(state[0] || now) - now, 0].max # how far past now the TAT is
        after = ahead + (cost * @interval)
        return [false, units(ahead), (after - @capacity).ceil, ahead, NO_RECEIPT] if after > @capacity + 1e-6

        state[0] = now + after.ceil
        [true, units(after.ceil), 0, after.ceil, NO_RECEIPT]
      end

      def give_back_gcra(state, cost, _receipt)
        state[0] = (state[0] - (cost * @interval)).ceil if state[0]
      end

      # The units that fit before a TAT `ahead` past now reaches the burst.
      def units(ahead)
        [(((@capacity - ahead) / @interval) + 1e-9).floor, 0].max
      end

      # state: [window number, used]
      def window(state, now, cost)
        window = now / @per
        ends = (window + 1) * @per
        used = state[0] == window ? state[1] : 0
        return [false, [@amount - used, 0].max, ends - now, ends - now, NO_RECEIPT] if used + cost > @amount

        state.replace([window, used + cost])
        [true, @amount - used - cost, 0, ends - now, [window, 0]]
      end

      def give_back_window(state, cost, receipt)
        state[1] = [state[1] - cost, 0].max if state[0] == receipt[0]
      end

      # state: admission times, oldest first, one per unit
      def sliding(state, now, cost)
        state.reject! { |time| time <= now - @per }
        used = state.size
        return sliding_refusal(state, used, now, cost) if used + cost > @amount

        cost.times { state << now }
        [true, @amount - used - cost, 0, @per, [now, used + 1]]
      end

      def sliding_refusal(state, used, now, cost)
        [false, [@amount - used, 0].max, left_after(state, used + cost - @amount - 1, now),
         left_after(state, used - 1, now), NO_RECEIPT]
      end

      def give_back_sliding(state, cost, receipt)
        cost.times { (at = state.index(receipt[0])) && state.delete_at(at) }
      end

      # Until the unit at `rank` (0: the oldest; -1: the newest) leaves the window.
      def left_after(state, rank, now)
        state[rank] ? state[rank] + @per - now : @per
      end
    end
  end
end
