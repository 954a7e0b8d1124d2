# frozen_string_literal: true

module LockManager
  # The options of `lock_with`, checked, and stored JSON-safe (string keys, plain values) under
  # the Sidekiq option "lock_manager", so `set(lock_manager: { ... })` can override them per job.
  # A Proc key cannot travel in a job's JSON: it stays on the job class (see Worker).
  class JobOptions
    MODES = %w[nonblocking blocking].freeze
    CONFLICTS = %w[skip reschedule raise].freeze
    NAMES = %w[key timeout on_conflict reschedule_in limit renew max_hold].freeze
    DEFAULTS = { "mode" => "nonblocking", "timeout" => 30, "on_conflict" => "skip", "reschedule_in" => 5,
                 "limit" => 1 }.freeze

    attr_reader :mode, :key, :timeout, :on_conflict, :reschedule_in, :limit, :renew, :max_hold

    # @param options [Hash] symbol or string keys, as given to lock_with or set(lock_manager: ...)
    # @raise [ArgumentError] naming the first bad option
    def initialize(options)
      given = known(options.transform_keys(&:to_s))
      options = DEFAULTS.merge(given)
      @mode = choice(options["mode"], MODES, "mode")
      @key = key_option(options["key"])
      @on_conflict = conflict_option(options["on_conflict"], given.key?("on_conflict"))
      @timeout = seconds(options, "timeout")
      @reschedule_in = seconds(options, "reschedule_in")
      @limit, @renew, @max_hold = holding(options)
    end

    # The options of the lock call: renewal only when lock_with chose (else the configured default).
    def lock_options
      { timeout: timeout, limit: limit, renew: renew, max_hold: max_hold }.compact
    end

    def blocking?
      mode == "blocking"
    end

    # What goes into sidekiq_options: nothing that JSON cannot carry, nothing :blocking ignores.
    def to_h
      conflict = { "on_conflict" => on_conflict, "reschedule_in" => reschedule_in } unless blocking?
      { "mode" => mode, "key" => (key if key.is_a?(String)), "timeout" => timeout, "limit" => limit,
        "renew" => renew, "max_hold" => max_hold, **conflict.to_h }.compact
    end

    private

    def seconds(options, name)
      Arguments.seconds(options[name], "lock_with #{name}")
    end

    # @return [Array] how many may hold the lock, whether it is renewed (nil: the configured
    #   default), and for how long at most
    def holding(options)
      limit = Arguments.positive_integer(options["limit"], "lock_with limit")
      renew = options.key?("renew") ? Arguments.boolean(options["renew"], "lock_with renew") : nil
      max_hold = Arguments.optional_seconds(options["max_hold"], "lock_with max_hold")
      raise ArgumentError, "lock_with max_hold needs renew: true" if max_hold && !renew

      [limit, renew, max_hold]
    end

    def known(options)
      unknown = options.keys - NAMES - ["mode"]
      return options if unknown.empty?

      raise ArgumentError, "lock_with: unknown option#{"s" if unknown.size > 1} #{unknown.join(", ")}"
    end

    def choice(value, allowed, name)
      text = value.to_s
      return text if (value.is_a?(Symbol) || value.is_a?(String)) && allowed.include?(text)

      raise ArgumentError,
            "lock_with #{name} must be one of #{allowed.map { |a| ":#{a}" }.join(", ")}, got #{value.inspect}"
    end

    def key_option(key)
      case key
      when nil, :class, "class" then nil
      when Proc then key
      when String
        raise ArgumentError, "lock_with key must not be empty" if key.empty?

        key
      else
        raise ArgumentError, "lock_with key must be a String, a Proc over the job's arguments, or :class, " \
                             "got #{key.inspect}"
      end
    end

    def conflict_option(value, given)
      if blocking? && given && value.to_s != "raise"
        raise ArgumentError, "lock_with on_conflict is for :nonblocking; :blocking waits up to timeout, then raises"
      end

      choice(value, CONFLICTS, "on_conflict")
    end
  end
end
