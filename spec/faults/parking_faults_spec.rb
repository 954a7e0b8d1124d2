# frozen_string_literal: true

require "spec_helper"
require_relative "../support/fault_helpers"
require_relative "../support/process_helpers"

# The line of parked jobs (on_conflict: :park; Claims#park) through Redis restarts: what survives is
# what Redis kept, as for Sidekiq's own queues. The parking core only: spec/sidekiq/parking_spec.rb
# runs it under a real Sidekiq.
RSpec.describe "Parked jobs in Redis (Claims#park), under faults" do
  include FaultHelpers
  include ProcessHelpers

  after { stop_all }

  def park(locker, jid)
    Thread.new do # another thread than the holder's: a Locker's thread holds a plain lock once
      locker.park("account", jid, ttl: 5, grace: 1, most: nil, schedule: "#{prefix}schedule", fallback: "fallback",
                                  push: [["SADD", "#{prefix}queues", "default"], ["LPUSH", "#{prefix}queue", jid]])
    end.value
  end

  def locker_on(server)
    LockManager::Locker.new(redis_url: server.url, key_prefix: prefix, connect_timeout: 1)
  end

  it "keeps the line across a SIGKILL and restart with appendonly: the release hands it on as before" do
    server = own_server(FaultyRedisServer, appendonly: true)
    locker = locker_on(server)
    holder = locker.adopt("account", "jid-holder", timeout: 30)
    expect([park(locker, "jid-1"), park(locker, "jid-2")]).to eq([[:parked, 1], [:parked, 2]])

    server.restart

    client = server.client
    expect(client.zrange("#{prefix}schedule", 0, -1)).to eq(["fallback"]) # and the fallback with it
    expect(holder.release_parked).to be(true)
    expect([client.get("#{prefix}account"), client.lrange("#{prefix}queue", 0, -1)]).to eq(["jid-1", ["jid-1"]])
    expect(locker.parked_count("account")).to eq(1)
  end

  it "loses the line with the rest of Redis when it restarts without persistence, as it loses Sidekiq's queues" do
    server = own_server(FaultyRedisServer, appendonly: false)
    locker = locker_on(server)
    holder = locker.adopt("account", "jid-holder", timeout: 30)
    park(locker, "jid-1")

    server.restart

    expect(locker.parked_count("account")).to eq(0)
    expect(holder.release_parked).to be(false) # its lock is gone too: nothing to hand on
    expect(server.client.keys("*")).to eq([])
  end

  it "refuses a token its line could not find again (JSON would escape it), before anything reaches Redis" do
    locker = LockManager::Locker.new(redis_url: "redis://127.0.0.1:1", key_prefix: prefix) # nothing listens
    ["a/b", 'a"b', "a\\b", "a\nb"].each do |token|
      expect do
        locker.park("account", token, ttl: 5, grace: 1, most: nil, schedule: "s", fallback: "f", push: [%w[LPUSH q x]])
      end.to raise_error(ArgumentError, /token must have no quote/)
    end
  end

  it "hands a lock that expired under the line to the first parked job when its fallback asks (Unpark)" do
    server = own_server(FaultyRedisServer)
    locker = locker_on(server)
    Thread.new { locker.adopt("account", "jid-holder", timeout: 0.3) }.value.then { |lock| lock&.keep(0.3) }
    park(locker, "jid-1")
    client = server.client
    due = client.zscore("#{prefix}schedule", "fallback")
    expect(due).to be_within(1.5).of(Time.now.to_f + 0.3 + 1) # the lock's TTL and the grace

    expect(locker.unpark("account")).to be_nil # still held: the fallback is armed again instead
    eventually(timeout: 5) { client.get("#{prefix}account").nil? }
    expect(locker.unpark("account")).to eq("jid-1")
    expect([client.get("#{prefix}account"), client.lrange("#{prefix}queue", 0, -1)]).to eq(["jid-1", ["jid-1"]])
    expect(client.zrange("#{prefix}schedule", 0, -1)).to eq([]) # the line is empty: no fallback left
  end
end
