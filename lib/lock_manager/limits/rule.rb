# frozen_string_literal: true

module LockManager
  class Limiter
    # What a limiter counts, checked once: one of `rate:` (a smooth rate, GCRA: `burst` at once
    # from idle, then one every per / rate), `window:` (so many per window of `per`, the windows
    # aligned to Redis's clock) or `sliding_window:` (so many in any `per` ending now, exactly).
    KINDS = { rate: :gcra, window: :window, sliding_window: :sliding }.freeze
    # GCRA keeps its arrival time in whole microseconds.
    MAX_RATE_PER_SECOND = 1_000_000

    Rule = Struct.new(:kind, :amount, :per, :burst) do
      # @raise [ArgumentError] naming the first bad option
      def self.from(per:, rate: nil, window: nil, sliding_window: nil, burst: nil)
        option, amount = one_of(rate: rate, window: window, sliding_window: sliding_window)
        per = Arguments.seconds(per, :per).to_f
        if option == :rate
          return new(:gcra, rate(amount, per), per,
                     burst.nil? ? 1 : Arguments.positive_integer(burst, :burst))
        end
        raise ArgumentError, "burst applies to rate: only, not to #{option}:" if burst

        new(KINDS[option], Arguments.positive_integer(amount, option), per, 1)
      end

      # The rule a limiter's key was kept by, as its script stores it: GCRA's emission interval
      # (µs) and burst, a window's length (µs) and limit. A slow rate reads "1 per <interval>s".
      def self.stored(kind, micros, number)
        seconds = micros / 1_000_000
        return new(kind, number, seconds, 1) unless kind == :gcra
        return new(kind, 1.0, seconds, number) if seconds >= 1

        new(kind, 1 / seconds, 1.0, number)
      end

      def self.one_of(**options)
        given = options.compact
        return given.first if given.size == 1

        raise ArgumentError, "a limiter needs one of rate:, window: or sliding_window:, got #{given.keys.inspect}"
      end

      def self.rate(rate, per)
        unless Arguments.real?(rate) && rate.positive? && rate.finite? && rate / per <= MAX_RATE_PER_SECOND
          raise ArgumentError, "rate must be a positive number, at most #{MAX_RATE_PER_SECOND} per second, " \
                               "got #{rate.inspect}"
        end

        rate.to_f
      end

      # The most one call may cost: more could never be admitted.
      def capacity
        kind == :gcra ? burst : amount
      end

      def check_cost(cost)
        Arguments.positive_integer(cost, :cost)
        return cost if cost <= capacity

        limit = kind == :gcra ? "burst (#{burst})" : "the limit (#{amount})"
        raise ArgumentError, "cost #{cost} is more than #{limit}: it could never be admitted"
      end

      def to_s
        case kind
        when :gcra then format("%<rate>g per %<per>gs, burst %<burst>d", rate: amount, per: per, burst: burst)
        when :window then format("%<limit>d per %<per>gs window", limit: amount, per: per)
        else format("%<limit>d in any %<per>gs", limit: amount, per: per)
        end
      end
    end
  end
end
