# frozen_string_literal: true

module LockManager
  # The options of a job that finds its lock held (part of JobOptions): `on_conflict`, and for
  # on_conflict: :park, `park_limit` (how many jobs may wait on one lock; nil: no limit) and
  # `when_full` (what a job beyond it does).
  module ConflictOptions
    CONFLICTS = %w[skip reschedule raise park replace].freeze
    # The modes whose push can replace a pending job of the same key.
    REPLACING_MODES = %w[until_executing until_executed].freeze
    WHEN_FULL = %w[skip raise reschedule].freeze
    # The modes whose run lock a job can park on.
    PARKING_MODES = %w[nonblocking until_and_while_executing].freeze

    attr_reader :park_limit, :when_full

    # Whether a job that finds its lock held waits in Redis for its release.
    def park?
      on_conflict == "park"
    end

    # Whether a push replaces the pending job of its key (and takes its lock over).
    def replace?
      on_conflict == "replace"
    end

    private

    # Whether the job can find its lock held when it starts: every mode but these three.
    def conflicts?
      !blocking? && mode != "until_executing" && !until_expired?
    end

    def conflict_option(value, given)
      return replace_option if given && value.to_s == "replace"

      if given && !conflicts? && value.to_s != "raise"
        raise ArgumentError, "lock_with on_conflict is not for :#{mode}: " +
                             (blocking? ? "it waits up to timeout, then raises" : "it takes no lock when the job runs")
      end

      choice(value, CONFLICTS, "on_conflict")
    end

    # A push replaces a pending job: one of the until_* modes that a running job does not hold (they
    # release the lock as it starts, or hold it by its id, so a running job is never replaced).
    def replace_option
      return "replace" if REPLACING_MODES.include?(mode)

      raise ArgumentError, "lock_with on_conflict: :replace is for :until_executing and :until_executed"
    end

    # Checked once the others are: a parked job's lock is renewed while the job runs (the line waits
    # for its release, not its expiry). With limit: N, jobs park while its N places are taken.
    def read_parking(given)
      return refuse_parking_options(given) unless park?
      unless PARKING_MODES.include?(mode)
        raise ArgumentError, "lock_with on_conflict: :park is for :nonblocking and :until_and_while_executing"
      end
      raise ArgumentError, "lock_with on_conflict: :park renews the lock while the job runs" if renew == false

      @park_limit = given["park_limit"] && Arguments.positive_integer(given["park_limit"], "lock_with park_limit")
      @when_full = choice(given.fetch("when_full", "skip"), WHEN_FULL, "when_full")
    end

    def refuse_parking_options(given)
      %w[park_limit when_full].each do |name|
        raise ArgumentError, "lock_with #{name} is for on_conflict: :park" if given.key?(name)
      end
    end

    # What to_h keeps of these: nothing for a mode that never meets its lock held.
    def conflict_h
      return { "on_conflict" => on_conflict } if replace? && !conflicts?
      return {} unless conflicts?

      parking = { "park_limit" => park_limit, "when_full" => when_full } if park?
      { "on_conflict" => on_conflict, **backoff.to_h, **parking.to_h }
    end
  end
end
