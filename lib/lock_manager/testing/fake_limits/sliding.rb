# frozen_string_literal: true

module LockManager
  module Testing
    module FakeLimits
      # lua/limit_sliding.lua. state: { units: [[time, name], ...] } by time: those admitted, and
      # those promised to jobs (a tenth of a window after their moment).
      class Sliding < Decision
        def initialize(*)
          super
          @units = (state[:units] ||= [])
          @units.reject! { |time, _| time <= now - rule.per }
          @allowance = rule.per / 10
        end

        def decide(promise)
          redeemed = redeem(promise) if redeem?(promise)
          return redeemed if redeemed

          used = @units.size
          return [true, left(used + cost), 0, add(now, used), [now, used + 1]] if used + cost <= rule.amount

          wait = left_after(used + cost - rule.amount - 1)
          return [false, left(used), wait, newest, NONE] unless promise

          at = now + wait + @allowance
          [false, left(used), wait, add(at, used), [at, used + 1]]
        end

        def give_back(receipt)
          own = names(*receipt)
          @units.reject! { |_, name| own.include?(name) }
        end

        private

        # Adds the units at `time`: until the limiter is idle again.
        def add(time, used)
          reset = [time - now + rule.per, newest].max
          @units.concat(names(time, used + 1).map { |name| [time, name] }).sort!
          reset
        end

        # Within its allowance, admitted on its units; later, they move to now if every window
        # ending from when they newly count has room; nil (and the units gone) to decide again.
        def redeem(promise)
          own = names(*promise)
          return unless @units.any? { |_, name| name == own[0] }
          return on_time(promise) if promise[0] >= now
          return moved(own, promise) if fits?([now, promise[0] + rule.per].max)

          @units.reject! { |_, name| own.include?(name) }
          nil
        end

        def on_time(promise)
          early = [promise[0] - @allowance - now, 0].max
          [early.zero?, left(@units.size), early, newest, promise]
        end

        def moved(own, promise)
          @units.map! { |time, name| own.include?(name) ? [now, name] : [time, name] }.sort!
          [true, left(@units.size), 0, [newest, rule.per].max, promise]
        end

        # Whether every window ending from `from` (until the units would leave) has room for them.
        def fits?(from)
          ends = @units.map(&:first).select { |time| time > from && time < now + rule.per }
          [from, *ends].all? { |at| count_in(at - rule.per, at) + cost <= rule.amount }
        end

        def count_in(after, upto)
          @units.count { |time, _| time > after && time <= upto }
        end

        def names(time, first)
          Array.new(cost) { |n| "#{time}:#{first + n}" }
        end

        # Until the unit at `rank` (0: the oldest) leaves the window.
        def left_after(rank)
          @units[rank] ? [@units[rank][0] + rule.per - now, 0].max : rule.per
        end

        def newest
          @units.empty? ? 0 : left_after(@units.size - 1)
        end
      end
    end
  end
end
