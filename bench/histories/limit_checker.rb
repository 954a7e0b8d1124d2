# frozen_string_literal: true

module Histories
  # Counts what a sliding-window limiter (at most `limit` admitted in any `per` seconds) must not
  # do, from decisions recorded by the clients: Hashes with start and end (CLOCK_MONOTONIC, the
  # call), admitted (true/false), or error. Pure, as Checker is.
  #
  # Redis decided each call at a moment between its start and its end. So decisions whose calls
  # all lie within less than `per` seconds were certainly decided within `per`: more than `limit`
  # of them admitted is certainly over the limit. Such a group is judged by its last-ending call:
  # an admitted call is **over** when it and the admitted calls that ended before it and started
  # after its end less `per` are more than `limit`. (A violation spread over slightly more than
  # `per` of client time goes unseen: the count errs towards fewer.)
  class LimitChecker
    Summary = Struct.new(:decisions, :admitted, :over, :busiest, :errors, :recovery, keyword_init: true)

    def initialize(decisions, limit:, per:, faults: [])
      @decisions = decisions
      @limit = limit
      @per = per
      @faults = faults
      @admitted = decisions.select { |decision| decision[:admitted] }.sort_by { |decision| decision[:end] }
    end

    def summary
      counts = within_per
      Summary.new(decisions: @decisions.size, admitted: @admitted.size, over: counts.count { |count| count > @limit },
                  busiest: counts.max || 0, errors: @decisions.count { |decision| decision[:error] },
                  recovery: recovery)
    end

    # For each admitted call (by end), how many admitted calls lie certainly within `per` with it.
    def within_per
      @admitted.each_with_index.map do |last, index|
        since = last[:end] - @per
        index.downto(0).take_while { |i| @admitted[i][:end] > since }.count { |i| @admitted[i][:start] > since }
      end
    end

    # From the fault's end to the first admitted call that came back after it (one sent while the
    # restarted server was still being looked at counts, at 0); nil without a fault or one.
    def recovery
      @faults.filter_map do |fault|
        back = @admitted.find { |decision| decision[:end] >= fault[:end] }
        back && [back[:end] - fault[:end], 0].max
      end.max
    end
  end
end
