# frozen_string_literal: true

module LockManager
  # Checks made before anything reaches Redis; each failure names the argument.
  module Arguments
    REDIS_SCHEMES = %w[redis rediss unix].freeze
    # The longest time the gem can honour: scripts add milliseconds to Redis's clock in doubles,
    # exact up to 2**53 (2**52 ms is about 142,000 years).
    MAX_MILLISECONDS = 2**52
    MAX_WHOLE_SECONDS = MAX_MILLISECONDS / 1000
    # `limit` travels as an unsigned 32-bit number; a pool holds at most this many connections.
    MAX_LIMIT = (2**32) - 1
    MAX_POOL_SIZE = 65_535
    BOOLEANS = [true, false].freeze

    module_function

    # @return [String] the key, not copied: the extension reads its bytes whatever its encoding
    #   (keys are bytes, not text) and copies them before Ruby code can change it
    def key(key, name = :key)
      key = key.name if key.is_a?(Symbol) # frozen and cached: no new String per call
      raise ArgumentError, "#{name} must be a String or Symbol, got #{key.inspect}" unless key.is_a?(String)
      raise ArgumentError, "#{name} must not be empty" if key.empty?

      key
    end

    # @param value [Integer, Float, Rational, ActiveSupport::Duration] (Rails' `10.seconds` too)
    # @return [Numeric] a positive, finite number of seconds, at most MAX_WHOLE_SECONDS
    def seconds(value, name)
      value = value.to_f if duration?(value)
      unless real?(value) && value.positive? && value.finite? && value * 1000 <= MAX_MILLISECONDS
        raise ArgumentError, "#{name} must be a positive number of seconds up to #{MAX_WHOLE_SECONDS}, " \
                             "got #{value.inspect}"
      end

      value
    end

    def optional_seconds(value, name)
      value.nil? ? nil : seconds(value, name)
    end

    # @return [Integer] whole milliseconds, at least 1
    def milliseconds(value, name)
      # Whole seconds, the usual case, skip the Float and ActiveSupport checks.
      return value * 1000 if value.is_a?(Integer) && value.positive? && value <= MAX_WHOLE_SECONDS

      [(seconds(value, name) * 1000).ceil, 1].max
    end

    def real?(value)
      value.is_a?(Integer) || value.is_a?(Float) || value.is_a?(Rational)
    end

    # ActiveSupport::Duration, recognised without depending on ActiveSupport.
    def duration?(value)
      defined?(ActiveSupport::Duration) && value.is_a?(ActiveSupport::Duration)
    end

    def positive_integer(value, name, max: MAX_LIMIT)
      return value if value.is_a?(Integer) && value >= 1 && value <= max

      raise ArgumentError, "#{name} must be an Integer from 1 to #{max}, got #{value.inspect}"
    end

    def pool_size(value, name)
      positive_integer(value, name, max: MAX_POOL_SIZE)
    end

    def boolean(value, name)
      raise ArgumentError, "#{name} must be true or false, got #{value.inspect}" unless BOOLEANS.include?(value)

      value
    end

    # `renew` and `max_hold` together, as the extension takes them.
    # @return [false, true, Integer] no renewal, renewal until released, or renewal for at most
    #   this many ms
    def renewal(renew, max_hold, default_max_hold = nil)
      boolean(renew, :renew)
      raise ArgumentError, "max_hold needs renew: true (without renewal the lock lives `timeout`)" if max_hold && !renew
      return false unless renew

      max_hold ||= default_max_hold
      max_hold ? milliseconds(max_hold, :max_hold) : true
    end

    ON_LOST = %i[warn raise].freeze
    # Redis unreachable when a lock is asked for: raise, run the block unlocked, or act as if taken.
    ON_REDIS_ERROR = %i[raise run skip].freeze

    def on_lost(value, name)
      return value if ON_LOST.include?(value)

      raise ArgumentError, "#{name} must be :warn or :raise, got #{value.inspect}"
    end

    def on_redis_error(value, name)
      return value if ON_REDIS_ERROR.include?(value)

      raise ArgumentError, "#{name} must be :raise, :run or :skip, got #{value.inspect}"
    end

    def string(value, name)
      raise ArgumentError, "#{name} must be a String, got #{value.inspect}" unless value.is_a?(String)

      value
    end

    # A prefix every lock key starts with; it must keep them apart from the gem's own keys.
    def key_prefix(value, name = :key_prefix)
      problem = Native.key_prefix_problem(string(value, name))
      raise ArgumentError, problem if problem

      value
    end

    def redis_url(url, name = :redis_url)
      raise ArgumentError, "#{name} must be a String" unless url.is_a?(String)

      scheme = url[/\A([a-z][a-z0-9+.-]*):/i, 1]&.downcase
      unless REDIS_SCHEMES.include?(scheme)
        raise ArgumentError, "#{name} must start with redis://, rediss:// or unix://, got #{redact(url).inspect}"
      end

      problem = Native.url_problem(url)
      raise ArgumentError, "#{name} is not a usable URL (#{problem}): #{redact(url).inspect}" if problem

      url
    end

    # The URL with any password replaced: safe for messages, logs and #inspect. Everything up to
    # the last "@" counts as credentials, as URL parsers read it (a password may contain "@" or
    # "/"); a password given as a query parameter is replaced too.
    def redact(url)
      return url.to_s.sub(/\A.*@/m, "REDACTED@") unless url.to_s.include?("://") # no scheme: all before "@"

      url.to_s.sub(%r{\A([^:/]*://)(.*)@}m) do
        userinfo = Regexp.last_match(2)
        user = userinfo.include?(":") ? userinfo.split(":", 2).first : ""
        "#{Regexp.last_match(1)}#{user.include?("/") ? "" : user}:REDACTED@"
      end.gsub(/([?&](?:pass|password)=)[^&]*/i, '\1REDACTED')
    end
  end
end
