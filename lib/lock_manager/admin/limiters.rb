# frozen_string_literal: true

module LockManager
  # The rate limiters' part of LockManager::Admin (admin.rb): listed and reset as its locks are.
  class Admin
    # A rate limiter in use (an idle one keeps nothing and is not listed): its name (without
    # key_prefix), kind (:gcra, :window, :sliding), rule (a Limiter::Rule, as its count was kept
    # by), the units used and remaining now, and in seconds until one more unit would be admitted
    # (retry_after: 0 while any remain) and until it is idle again (reset_after). A
    # Limiter.concurrent is a `limit:` lock: #locks lists it.
    LimiterInfo = Struct.new(:name, :kind, :rule, :used, :remaining, :retry_after, :reset_after,
                             keyword_init: true) do
      # When one more unit would be admitted, by this machine's clock.
      def next_free_at
        Time.now + retry_after
      end

      # Seconds until one more unit, as shown: rounded up to a tenth (never "0.0" a few ms before),
      # nil while any remain.
      def next_free_in
        (retry_after * 10).ceil / 10.0 if retry_after.positive?
      end
    end

    # The rate limiters (Limiter.new, .window, .sliding_window) whose names match `pattern`,
    # sorted by name: SCAN finds them, then each is read by its own script without changing it
    # (a round trip per limiter).
    # @param pattern [String] a Redis glob over names without key_prefix
    # @param limit [Integer, nil] the first `limit` in sort order (nil: all)
    # @return [Array<LimiterInfo>]
    def limiters(pattern = "*", limit: DEFAULT_LIMIT)
      limit = Arguments.positive_integer(limit, :limit) if limit
      native.admin_limiters(Arguments.key(pattern, :pattern), limit).map { |raw| limiter_info(raw) }
    end

    # Forgets what the limiter `name` has counted (of `kind`; nil: every kind of that name), as
    # Limiter#reset: it admits its whole rule again.
    # @param kind [Symbol, nil] :gcra, :window or :sliding
    # @return [Boolean] whether it had counted anything
    def reset_limiter(name, kind: nil)
      unless kind.nil? || Limiter::KINDS.value?(kind)
        raise ArgumentError, "kind must be one of #{Limiter::KINDS.values.inspect} or nil, got #{kind.inspect}"
      end

      native.admin_reset_limiter(Arguments.key(name, :name), kind&.to_s)
    end

    private

    def limiter_info(raw)
      name, kind, used, remaining, retry_after, reset_after, first, second = raw
      kind = kind.to_sym
      LimiterInfo.new(name: name, kind: kind, rule: Limiter::Rule.stored(kind, first.to_f, Integer(second)),
                      used: used, remaining: remaining, retry_after: retry_after, reset_after: reset_after)
    end
  end
end
