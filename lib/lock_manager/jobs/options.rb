# frozen_string_literal: true

require_relative "conflict_options"
require_relative "backoff"

module LockManager
  # The options of `lock_with`, checked, and stored JSON-safe (string keys, plain values) under
  # the Sidekiq option "lock_manager", so `set(lock_manager: { ... })` can override them per job.
  # A Proc key cannot travel in a job's JSON: it stays on the job class (see Worker).
  class JobOptions
    include ConflictOptions

    # Held while the job runs: one attempt, or waiting for the lock.
    RUN_MODES = %w[nonblocking blocking].freeze
    # Held from push: until the job starts, until it succeeds, until it starts and then while it runs, or
    # for unique_for whatever the job does.
    UNIQUE_MODES = %w[until_executing until_executed until_and_while_executing until_expired].freeze
    MODES = (RUN_MODES + UNIQUE_MODES).freeze
    NAMES = (%w[key timeout on_conflict limit renew max_hold unique_for park_limit when_full] +
             JobBackoff::NAMES).freeze
    DEFAULTS = { "mode" => "nonblocking", "timeout" => 30, "on_conflict" => "skip", "limit" => 1 }.freeze

    # `backoff`: when a rescheduled job comes back, and how many times (JobBackoff).
    attr_reader :mode, :key, :timeout, :on_conflict, :limit, :renew, :max_hold, :unique_for, :backoff

    # @param options [Hash] symbol or string keys, as given to lock_with or set(lock_manager: ...)
    # @raise [ArgumentError] naming the first bad option
    def initialize(options)
      given = known(options.transform_keys(&:to_s))
      options = DEFAULTS.merge(given)
      @mode = choice(options["mode"], MODES, "mode")
      @key = key_option(options["key"])
      @on_conflict = conflict_option(options["on_conflict"], given.key?("on_conflict"))
      read_times(options)
      @backoff = JobBackoff.new(options, reschedule: %w[reschedule park].include?(on_conflict))
      read_parking(given)
    end

    # The options of the lock call: renewal only when lock_with chose (else the configured default).
    def lock_options
      { timeout: timeout, limit: limit, renew: renew, max_hold: max_hold }.compact
    end

    def blocking?
      mode == "blocking"
    end

    # Whether the lock is taken when the job is pushed (the until_* strategies).
    def unique?
      UNIQUE_MODES.include?(mode)
    end

    # Whether the lock, taken at push, lives unique_for whatever the job does.
    def until_expired?
      mode == "until_expired"
    end

    # What goes into sidekiq_options: nothing that JSON cannot carry, nothing the mode ignores.
    def to_h
      { "mode" => mode, "key" => (key if key.is_a?(String)), "timeout" => timeout, "limit" => limit,
        "renew" => renew, "max_hold" => max_hold, "unique_for" => unique_for, **conflict_h }
        .compact.except(*implied)
    end

    private

    def read_times(options)
      @timeout = seconds(options, "timeout")
      @limit, @renew, @max_hold = holding(options)
      @unique_for = unique_for_option(options["unique_for"])
    end

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
      return [limit, renew, max_hold] unless unique?

      raise ArgumentError, "lock_with :#{mode} holds one lock per job: limit is not for it" if limit != 1
      # A unique job's lock lives `timeout` while it runs and is renewed until it ends.
      raise ArgumentError, "lock_with :#{mode} always renews its lock while the job runs" if renew == false

      [1, true, max_hold]
    end

    # Renewal is implied for the until_* modes, and their limit is 1: what to_h leaves out.
    def implied
      unique? ? %w[limit renew] : []
    end

    def unique_for_option(value)
      if !unique? && !value.nil?
        raise ArgumentError, "lock_with unique_for is for :until_executing, :until_executed, " \
                             ":until_and_while_executing and :until_expired"
      end
      return unless unique?

      if value.nil?
        raise ArgumentError, "lock_with :#{mode} needs unique_for: the seconds a pending job's lock lives " \
                             "at most (counted from its scheduled time), so that no lock outlives a lost job"
      end

      Arguments.seconds(value, "lock_with unique_for")
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
  end

  # The options of a job: its class's (`defaults`), overridden by what the job carries, checked
  # once per distinct pair and shared after (frozen). Every push and run of a job asks: checking
  # them again each time cost a unique push more instructions than its claim's Rust.
  module CheckedJobOptions
    # A job class's own, and those its pushes' set(lock_manager:) made. Past it the cache starts
    # again: options made per push must not grow it without end.
    LIMIT = 256
    @checked = {}

    # @raise [ArgumentError] naming the first bad option (nothing is kept)
    def self.fetch(defaults, given)
      @checked.fetch([defaults, given]) do
        options = JobOptions.new((defaults || {}).merge(given || {})).freeze
        @checked.clear if @checked.size >= LIMIT
        @checked[[defaults.dup.freeze, given.dup.freeze].freeze] = options
      end
    end
  end
end
