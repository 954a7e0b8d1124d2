# frozen_string_literal: true

require "spec_helper"
require "json"
require_relative "../support/parking"

# Jobs parked on a `limit: N` semaphore (a concurrency rule's places, throttle_with on_limit: :park):
# Claims#park with limit:, the permit a release hands to the first parked job, Claims#adopt of that
# permit by the job's id, and the fallback that hands the permits of holders that died. The parking
# core against the suite's Redis; spec/sidekiq/parking_spec.rb runs it under a real Sidekiq.
RSpec.describe "Jobs parked on a semaphore's permits (Claims#park with limit:)" do
  include Parking

  let(:locker) { new_locker }
  let(:key) { "tenant" }

  # The tokens holding a permit of the semaphore now.
  def permits
    redis.zrange("#{prefix}#{key}", 0, -1).sort
  end

  def adopt(jid)
    Thread.new { locker.adopt(key, jid, timeout: 30, limit: 2) }.value
  end

  it "parks a job while every permit is taken; a holder's release hands its permit to the first parked job" do
    first = adopt("jid-a")
    second = adopt("jid-b")
    expect([park_job(key, "jid-1", limit: 2), park_job(key, "jid-2", limit: 2)]).to eq([[:parked, 1], [:parked, 2]])
    expect(pushed_jids).to eq([])

    expect(first.release_parked).to be(true)
    expect(permits).to eq(%w[jid-1 jid-b])
    expect([pushed_jids, locker.parked_count(key)]).to eq([["jid-1"], 1])

    taken = adopt("jid-1") # the job, pushed, takes its permit over by its id
    expect(taken).to be_a(LockManager::Lock)
    expect(adopt("jid-newcomer")).to be_nil # both permits are held: a newcomer gets none
    expect(second.release_parked).to be(true)
    expect([permits, pushed_jids, locker.parked_count(key)]).to eq([%w[jid-1 jid-2], %w[jid-2 jid-1], 0])
    expect(taken.release_parked).to be(true)
    expect(permits).to eq(["jid-2"]) # nobody parked: the permit is freed
    expect(redis.zrange(parked_schedule, 0, -1)).to eq([]) # nor is a fallback left
  end

  it "hands a free permit at once to a job that parks while there is one" do
    adopt("jid-a")
    expect(park_job(key, "jid-1", limit: 2)).to eq([:handed, 0])
    expect([permits, pushed_jids, locker.parked_count(key)]).to eq([%w[jid-1 jid-a], ["jid-1"], 0])
  end

  it "hands the permits of holders that died to as many parked jobs when the fallback runs (Unpark)" do
    now_ms = redis.time.then { |seconds, micros| (seconds * 1000) + (micros / 1000) }
    # Their processes are gone; the permits live 1.5 s, which the parking and the first unpark below
    # take well within even on a loaded machine (a run with 0.3 s found one expired already).
    redis.zadd("#{prefix}#{key}", [[now_ms + 1500, "dead-1"], [now_ms + 1600, "dead-2"]])
    parked = %w[jid-1 jid-2 jid-3].map { |jid| park_job(key, jid, limit: 2) }
    expect(parked).to eq([[:parked, 1], [:parked, 2], [:parked, 3]])
    fallback = redis.zrange(parked_schedule, 0, -1, with_scores: true)
    expect(fallback.size).to eq(1)
    expect(fallback.first.last).to be_within(0.5).of((now_ms / 1000.0) + 1.5 + 1) # the first expiry, and the grace

    expect(locker.unpark(key)).to be_nil # both permits still live: it only waits again
    sleep 1.7
    expect(locker.unpark(key)).to eq("jid-1")
    expect([permits, pushed_jids, locker.parked_count(key)]).to eq([%w[jid-1 jid-2], %w[jid-2 jid-1], 1])
  end

  it "parks on a plain lock as before when the limit is 1" do
    hold_for_job(key)
    expect(park_job(key, "jid-1", limit: 1)).to eq([:parked, 1])
    expect(redis.type("#{prefix}#{key}")).to eq("string")
  end

  it "refuses a limit that is not a positive Integer before anything reaches Redis" do
    expect { park_job(key, "jid-1", limit: 0) }.to raise_error(ArgumentError, /limit/)
    expect { locker.adopt(key, "jid-1", limit: "2") }.to raise_error(ArgumentError, /limit/)
  end
end
