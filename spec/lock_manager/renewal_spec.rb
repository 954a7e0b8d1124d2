# frozen_string_literal: true

require "spec_helper"

# renew: true keeps a lock alive while its block runs, from one background thread per process,
# only while the lock is still ours, and no longer than max_hold.
RSpec.describe "Lease renewal" do
  let(:locker) { new_locker }

  def pttl(key)
    redis.pttl("#{prefix}#{key}")
  end

  def evalsha_calls
    redis.info("commandstats").dig("evalsha", "calls").to_i
  end

  it "keeps the lock alive past its timeout while the block runs, then releases it" do
    ttls = []
    result = locker.nonblocking_lock("k", timeout: 0.3, renew: true) do |lock|
      6.times do
        sleep 0.15
        ttls << pttl("k")
      end
      lock.lost?
    end

    expect(ttls).to all(be > 0) # 0.9 s in, for a 0.3 s timeout
    expect(result.result).to be(false)
    expect(result.lost?).to be(false)
    expect(redis.exists?("#{prefix}k")).to be(false)
  end

  it "renews a short lease on time while the renewal thread is waiting for a long one" do
    long = locker.try_lock("long", timeout: 30, renew: true) # its first renewal is 10 s away
    sleep 0.1 # the renewal thread now sleeps until then
    result = locker.nonblocking_lock("short", timeout: 0.3, renew: true) { sleep 0.9 }

    expect([result.run?, result.lost?]).to eq([true, false])
    expect(long.release).to be(true)
  end

  it "stops renewing at release" do
    locker.nonblocking_lock("k", timeout: 0.3, renew: true) { sleep 0.2 }
    before = evalsha_calls
    sleep 0.4 # more than one renewal period
    expect(evalsha_calls).to eq(before)
  end

  it "stops at max_hold: the lock then expires, another caller takes it, and the holder is told" do
    log = StringIO.new
    LockManager.configure { |c| c.logger = Logger.new(log) }
    taken_by_other = nil
    lost_in_block = nil
    result = locker.nonblocking_lock("k", timeout: 0.3, renew: true, max_hold: 0.5) do |lock|
      started = monotonic
      lost_in_block = eventually(timeout: 2) { lock.lost? && (monotonic - started) }
      taken_by_other = locker.nonblocking_lock("k") {}.run?
    end

    expect(lost_in_block).to be_between(0.45, 1.2)
    expect(taken_by_other).to be(true)
    expect(result.lost?).to be(true)
    expect(log.string).to include("lost")
  end

  it "tells the block as soon as a renewal finds the lock gone, and deletes nobody's lock" do
    result = locker.nonblocking_lock("k", timeout: 0.6, renew: true) do |lock|
      redis.set("#{prefix}k", "someone-else", px: 10_000)
      eventually(timeout: 1) { lock.lost? }
    end

    expect(result.lost?).to be(true)
    expect(redis.get("#{prefix}k")).to eq("someone-else")
  end

  it "renews a Lock handle until it is released" do
    lock = locker.try_lock("k", timeout: 0.3, renew: true)
    sleep 0.8
    expect([lock.owned?, lock.lost?]).to eq([true, false])
    expect(lock.release).to be(true)
    expect(redis.exists?("#{prefix}k")).to be(false)

    waited = locker.lock("w", timeout: 0.3, renew: true, max_hold: 0.4)
    eventually(timeout: 2) { waited.lost? }
    # The lease counts its TTL from before its last renewal was sent: Redis's copy may outlive the
    # report by that round trip (release would then still delete it, and say so).
    eventually(timeout: 1) { !redis.exists?("#{prefix}w") }
    expect(waited.release).to be(false)
  end

  it "renews each holder's own slot of a semaphore (limit > 1)" do
    holders = Array.new(2) do
      Thread.new { locker.nonblocking_lock("s", timeout: 0.3, limit: 2, renew: true) { sleep 0.9 } }
    end
    sleep 0.6
    expect(locker.nonblocking_lock("s", limit: 2) {}.run?).to be(false)
    expect(holders.map(&:value)).to all(have_attributes(run?: true, lost?: false))
  end

  it "renews by default when configured to, blocking_lock and the class methods included" do
    configure_shared_locker!
    LockManager.configure { |c| c.renew = true }
    value = LockManager::Locker.blocking_lock("k", timeout: 0.3) do
      sleep 0.6
      pttl("k")
    end
    expect(value).to be > 0
  end

  it "rejects bad renewal options before anything reaches Redis" do
    offline = LockManager::Locker.new(redis_url: closed_url)
    expect { offline.nonblocking_lock("k", max_hold: 5) {} }.to raise_error(ArgumentError, /max_hold needs renew/)
    expect do
      offline.nonblocking_lock("k", renew: "yes") do
      end
    end.to raise_error(ArgumentError, /renew must be true or false/)
    expect { offline.try_lock("k", renew: true, max_hold: -1) }.to raise_error(ArgumentError, /max_hold/)
    expect { LockManager.configure { |c| c.max_hold = "forever" } }.to raise_error(ArgumentError, /max_hold/)
  end
end
