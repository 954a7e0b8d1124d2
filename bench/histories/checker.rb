# frozen_string_literal: true

require "json"

module Histories
  # Tokens against time: which entries carry a token smaller than one seen before them.
  module TokenOrder
    module_function

    # Counts the entries whose token is not above the largest token of the entries whose `before`
    # time is earlier than their own `by` time, yielding each with that token. An equal token counts:
    # every acquisition has a number of its own, so another's equal one was issued twice.
    def not_above_before(entries, by:, before:)
      largest_before = running_max(entries, by: before)
      entries.sort_by { |entry| entry[by] }.count do |entry|
        largest = largest_before.call(entry[by])
        largest && entry[:token] <= largest && yield(entry, largest)
      end
    end

    # A function of time t: the largest token among `entries` whose `by` is before t. Call it with
    # growing t only (it walks `entries` once).
    def running_max(entries, by:)
      sorted = entries.sort_by { |entry| entry[by] }
      index = 0
      largest = nil
      lambda do |time|
        while index < sorted.size && sorted[index][by] < time
          largest = [largest, sorted[index][:token]].compact.max
          index += 1
        end
        largest
      end
    end
  end

  # Reads what the clients recorded and counts what must not happen. Pure: no Redis, no clock,
  # only the histories (so spec/lock_manager/history_checker_spec.rb can feed it made-up ones).
  #
  # An entry (one call) is a Hash with symbol keys, as Worker records it: pid, key, limit, start
  # (the call), acquired (block entered / handle returned), release_start, end (the call returned
  # or raised), token, outcome ("acquired", "not_acquired", "timed_out", "error", "unfinished"),
  # bound (the longest the call may wait: `wait`, or 0), lost (what the gem said), register
  # ("accepted", "rejected"), write_start, write_end. Times are CLOCK_MONOTONIC seconds: one clock
  # for every process of the machine, so entries of different processes compare.
  #
  # A fault is a Hash: kind, start, end, and pid when it targets one process (stopped: true when
  # that process was SIGSTOPped: its stopped time does not count against its calls' bounds).
  class Checker
    # How far past its bound a call may end before it counts as stuck: two read timeouts of 1 s
    # (a call may be retried once on a new connection after its first one timed out) and 1 s for
    # a loaded machine.
    MARGIN = 3.0
    PROBLEMS_OF_A_KIND = 3 # lines kept to describe each kind of problem

    Summary = Struct.new(:operations, :acquisitions, :lost, :overlaps, :stale_accepted, :stale_rejected,
                         :regressions, :stuck, :recovery, :problems, keyword_init: true)

    # @param dir [String] a directory of p<N>.jsonl files
    def self.load(dir)
      Dir.glob(File.join(dir, "p*.jsonl")).flat_map do |file|
        File.readlines(file).map { |line| JSON.parse(line, symbolize_names: true) }
      end
    end

    def initialize(entries, faults: [])
      @entries = entries
      @faults = faults
      @problems = Hash.new { |problems, kind| problems[kind] = [] }
      @acquired = entries.select { |entry| entry[:acquired] }
    end

    # @return [Summary] the counts, and a few lines describing the first problems of each kind
    def summary
      Summary.new(operations: @entries.size, acquisitions: @acquired.size, lost: @acquired.count { |e| e[:lost] },
                  overlaps: overlaps, stale_accepted: stale_accepted, stale_rejected: stale_rejected,
                  regressions: regressions, stuck: stuck, recovery: recovery, problems: @problems.values.flatten)
    end

    # Sections [acquired, release_start) that began while `limit` others of the same key were
    # still open: for a plain lock, every section that began inside another one.
    def overlaps
      @acquired.group_by { |entry| entry[:key] }.sum { |key, entries| overlaps_on(key, entries) }
    end

    # Writes the register accepted although a write with a token as large or larger had already
    # been accepted (its answer was back before this write was sent): the register should have
    # refused them. Judged from the histories, not from the register's own answer.
    def stale_accepted
      accepted = @entries.select { |entry| entry[:register] == "accepted" }
      accepted.group_by { |entry| entry[:key] }.sum do |key, writes|
        TokenOrder.not_above_before(writes, by: :write_start, before: :write_end) do |entry, largest|
          note(:stale, "stale write accepted on #{key}: #{describe(entry)} after token #{largest}")
        end
      end
    end

    def stale_rejected
      @entries.count { |entry| entry[:register] == "rejected" }
    end

    # Acquisitions whose token is not above that of an acquisition of the same key that was made
    # before their call even started: the order Redis granted them in is then certain.
    def regressions
      @acquired.group_by { |entry| entry[:key] }.sum do |key, entries|
        TokenOrder.not_above_before(entries, by: :start, before: :acquired) do |entry, largest|
          note(:regression, "token regression on #{key}: #{describe(entry)} after token #{largest}")
        end
      end
    end

    # Calls that neither acquired nor returned within their bound and MARGIN (the time their
    # process was stopped left out), and calls still running when their process gave up on them.
    def stuck
      @entries.count do |entry|
        if entry[:outcome] == "unfinished"
          note(:stuck, "unfinished: #{describe(entry)}")
        elsif (took = waited(entry)) > entry.fetch(:bound, 0) + MARGIN
          note(:stuck, format("stuck: %<call>s took %<took>.2f s, bound %<bound>s s", call: describe(entry),
                                                                                      took: took, bound: entry[:bound]))
        else
          false
        end
      end
    end

    # Seconds from a fault's end to the first acquisition after it (by the faulted process, when
    # the fault targets one); the longest over the faults; nil without any.
    def recovery
      @faults.filter_map do |fault|
        after = @acquired.select { |e| e[:acquired] >= fault[:end] && (fault[:pid].nil? || e[:pid] == fault[:pid]) }
        after.map { |entry| entry[:acquired] }.min&.-(fault[:end])
      end.max
    end

    private

    def overlaps_on(key, entries)
      open = []
      entries.sort_by { |entry| entry[:acquired] }.count do |entry|
        open.reject! { |other| section_end(other) <= entry[:acquired] }
        open << entry
        next false if open.size <= entry[:limit]

        note(:overlap, "overlap on #{key}: #{describe(entry)} while #{describe(open.first)} held it")
      end
    end

    def section_end(entry)
      entry[:release_start] || entry[:end] || Float::INFINITY
    end

    # How long the call waited: to its acquisition, or to its end, less its process's stopped time.
    def waited(entry)
      done = entry[:acquired] || entry[:end] || Float::INFINITY
      done - entry[:start] - stopped_during(entry[:pid], entry[:start], done)
    end

    def stopped_during(pid, from, to)
      @faults.select { |fault| fault[:stopped] && fault[:pid] == pid }.sum do |fault|
        [[fault[:end], to].min - [fault[:start], from].max, 0].max
      end
    end

    def describe(entry)
      at = entry[:acquired] ? format(" acquired at %.3f", entry[:acquired]) : ""
      "#{entry[:api]} of pid #{entry[:pid]} (token #{entry[:token].inspect}#{at}, #{entry[:outcome]})"
    end

    # Keeps the first few lines of each kind; returns true (the thing counts).
    def note(kind, line)
      @problems[kind] << line if @problems[kind].size < PROBLEMS_OF_A_KIND
      true
    end
  end
end
