# frozen_string_literal: true

require "spec_helper"
require_relative "../../bench/histories/checker"
require_relative "../../bench/histories/limit_checker"

# bench/histories.rb's checker can fail: fed made-up histories, it counts each kind of problem it
# exists to find, and nothing in a clean one. No Redis: the checker only reads what clients recorded.
RSpec.describe Histories::Checker do
  # One call as bench/histories/worker.rb records it: a blocking_lock on a plain lock that
  # acquired at `acquired`, held until `release`, and wrote its token to the register.
  def op(pid:, token:, acquired:, release:, key: "a", limit: 1, start: acquired - 0.01, register: "accepted",
         outcome: "acquired", bound: 4)
    { pid: pid, api: "blocking_lock", key: key, limit: limit, start: start, acquired: acquired,
      release_start: release, end: release + 0.001, token: token, outcome: outcome, bound: bound,
      register: (register if limit == 1), write_start: release - 0.002, write_end: release - 0.001 }
  end

  def summary(ops, faults: [])
    described_class.new(ops, faults: faults).summary
  end

  # Three holders one after the other on "a", two at once on the limit: 2 key "c".
  let(:clean) do
    [op(pid: 1, token: 10, acquired: 1.0, release: 1.1), op(pid: 2, token: 11, acquired: 1.2, release: 1.3),
     op(pid: 1, token: 12, acquired: 1.4, release: 1.5),
     op(pid: 1, token: 5, acquired: 1.0, release: 1.5, key: "c", limit: 2),
     op(pid: 2, token: 6, acquired: 1.1, release: 1.6, key: "c", limit: 2)]
  end

  it "counts zeros in a clean history" do
    expect(summary(clean).to_h).to include(operations: 5, acquisitions: 5, overlaps: 0, stale_accepted: 0,
                                           stale_rejected: 0, regressions: 0, stuck: 0)
  end

  it "counts two sections of one plain lock that overlap" do
    ops = clean + [op(pid: 3, token: 13, acquired: 1.45, release: 1.7)]
    expect(summary(ops).overlaps).to eq(1)
  end

  it "counts a third holder at once of a limit: 2 key, and not the second" do
    ops = clean + [op(pid: 3, token: 7, acquired: 1.2, release: 1.3, key: "c", limit: 2)]
    expect(summary(ops).overlaps).to eq(1)
  end

  it "counts a write and an acquisition whose token was issued before, to another holder" do
    twice = op(pid: 3, token: 11, acquired: 1.6, release: 1.7, start: 1.55)
    expect(summary(clean + [twice]).to_h).to include(stale_accepted: 1, regressions: 1)
  end

  it "counts a write accepted after a larger token's write came back, and a rejected one" do
    paused = op(pid: 3, token: 9, acquired: 0.5, release: 1.45)
    expect(summary(clean + [paused]).to_h).to include(stale_accepted: 1, stale_rejected: 0)
    expect(summary(clean + [paused.merge(register: "rejected")]).to_h).to include(stale_accepted: 0,
                                                                                  stale_rejected: 1)
  end

  it "counts a token smaller than one acquired before the call started" do
    ops = clean + [op(pid: 2, token: 8, acquired: 1.6, release: 1.7, register: "rejected")]
    expect(summary(ops).regressions).to eq(1)
  end

  it "does not count a smaller token whose call started before the larger one was acquired" do
    ops = clean + [op(pid: 2, token: 8, acquired: 1.6, release: 1.7, start: 0.9, register: "rejected")]
    expect(summary(ops).regressions).to eq(0)
  end

  it "counts a waiter that neither acquired nor raised by its deadline, and one never finished" do
    late = { pid: 4, api: "blocking_lock", key: "a", limit: 1, start: 1.0, end: 9.5, outcome: "timed_out", bound: 4 }
    hung = { pid: 4, api: "blocking_lock", key: "b", limit: 1, start: 1.0, outcome: "unfinished", bound: 4 }
    expect(summary(clean + [late, hung]).stuck).to eq(2)
  end

  it "leaves out the time a waiter's process was stopped" do
    late = { pid: 4, api: "blocking_lock", key: "a", limit: 1, start: 1.0, end: 9.5, outcome: "timed_out", bound: 4 }
    stop = { kind: "sigstop", pid: 4, stopped: true, start: 2.0, end: 6.0 }
    expect(summary(clean + [late], faults: [stop]).stuck).to eq(0)
  end

  it "measures recovery from a fault's end to the next acquisition (by the faulted process, when it names one)" do
    fault = { kind: "partition", pid: 1, start: 1.15, end: 1.25 }
    expect(summary(clean, faults: [fault]).recovery).to be_within(1e-9).of(0.15)
    expect(summary(clean, faults: [fault.merge(pid: nil)]).recovery).to be_within(1e-9).of(0.15)
    expect(summary(clean, faults: [fault.merge(pid: 9)]).recovery).to be_nil
  end
end

# The limiter rows' checker: admissions certainly within one window (their calls all between the
# last one's end less `per` and that end), more than the limit of them.
RSpec.describe Histories::LimitChecker do
  def decision(start, admitted: true, took: 0.001)
    { start: start, end: start + took, admitted: admitted }
  end

  def summary(decisions, faults: [])
    described_class.new(decisions, limit: 2, per: 1.0, faults: faults).summary
  end

  # Two admitted per second, refusals between.
  let(:clean) do
    [0.0, 0.1, 1.05, 1.15, 2.1, 2.2].map { |at| decision(at) } + [0.5, 1.5].map { |at| decision(at, admitted: false) }
  end

  it "counts nothing over the limit in a clean history" do
    expect(summary(clean).to_h).to include(decisions: 8, admitted: 6, over: 0, busiest: 2, errors: 0)
  end

  it "counts each admission that ends a window of three (up to 0.5, 1.05 and 1.15), and the busiest" do
    expect(summary(clean + [decision(0.5)]).to_h).to include(over: 3, busiest: 3)
  end

  it "does not count a third admission whose call may have been decided out of their window" do
    expect(summary(clean + [decision(0.5, took: 1.2)]).over).to eq(0)
  end

  it "counts errors, and measures recovery to the first admission back after the fault" do
    fault = { kind: "sigkill", start: 0.8, end: 1.0 }
    result = summary(clean + [{ start: 0.9, end: 0.95, error: "LockManager::ConnectionError" }], faults: [fault])
    expect(result.errors).to eq(1)
    expect(result.recovery).to be_within(1e-9).of(0.051)
  end
end
