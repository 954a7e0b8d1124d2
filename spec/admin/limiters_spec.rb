# frozen_string_literal: true

require "spec_helper"
require "lock_manager/admin"
require_relative "../support/topologies"

# LockManager::Admin's view of the rate limiters: each kind listed with the rule its count was
# kept by, what is used and what remains, read by its own script without changing anything; a
# reset by name; on a Cluster, every master's.
RSpec.describe "LockManager::Admin's limiters" do
  let(:locker) { new_locker }
  let(:admin) { LockManager::Admin.new(locker) }

  def limiters
    {
      # A unit every 10 s: none comes back between the burst's use and the listing, however loaded the machine
      # (at 100 per 1 s, one did in 10 ms, and a loaded run listed 19 used).
      api: LockManager::Limiter.new("api", rate: 1, per: 10, burst: 20, locker: locker),
      hourly: LockManager::Limiter.new("hourly", rate: 10, per: 3600, burst: 3, locker: locker),
      exports: LockManager::Limiter.window("exports:1", 10, per: 86_400, locker: locker), # ends at midnight UTC
      logins: LockManager::Limiter.sliding_window("login:1.2.3.4", 5, per: 60, locker: locker)
    }
  end

  def use(limiter, times)
    Array.new(times) { limiter.try_acquire.admitted? }.count(true)
  end

  it "lists every kind in use with its rule, used and remaining units, and when a unit is free again" do
    all = limiters
    expect([use(all[:api], 25), use(all[:hourly], 3), use(all[:exports], 4), use(all[:logins], 7)])
      .to eq([20, 3, 4, 5])
    LockManager::Limiter.new("idle", rate: 1, per: 1, locker: locker) # never used: nothing to list

    listed = admin.limiters
    expect(listed.map { |l| [l.name, l.kind, l.rule.to_s, l.used, l.remaining] }).to eq(
      [["api", :gcra, "1 per 10s, burst 20", 20, 0],
       ["exports:1", :window, "10 per 86400s window", 4, 6],
       ["hourly", :gcra, "1 per 360s, burst 3", 3, 0],
       ["login:1.2.3.4", :sliding, "5 in any 60s", 5, 0]]
    )
    api, exports, hourly, logins = listed
    expect(api.retry_after).to be_between(5, 10)
    expect(exports.retry_after).to eq(0)
    expect(exports.reset_after).to be_between(0, 86_400)
    expect(hourly.retry_after).to be_between(355, 360)
    expect(hourly.reset_after).to be_between(1075, 1080)
    expect(logins.retry_after).to be_between(55, 60)
    expect(logins.next_free_at).to be_within(6).of(Time.now + 60)
  end

  it "reads without changing anything: the same decisions follow, and the keys keep their expiry" do
    all = limiters
    use(all[:exports], 9)
    use(all[:logins], 4)
    ttls = redis.keys("lock_manager:*:limit:*:#{prefix}*").to_h { |key| [key, redis.pttl(key)] }
    expect(ttls.size).to eq(2)

    3.times { admin.limiters }

    ttls.each { |key, ttl| expect(redis.pttl(key)).to be_between(ttl - 2000, ttl) }
    expect([use(all[:exports], 3), use(all[:logins], 3)]).to eq([1, 1])
  end

  it "filters by a glob over names, and leaves out another prefix's limiters and every lock" do
    limiters.each_value { |limiter| use(limiter, 1) }
    other = LockManager::Locker.new(redis_url: redis_url, key_prefix: "#{prefix}other:")
    LockManager::Limiter.window("exports:2", 10, per: 86_400, locker: other).try_acquire
    locker.nonblocking_lock("exports:3") do
      expect(admin.limiters("exports:*").map(&:name)).to eq(["exports:1"])
      expect(admin.limiters(limit: 2).map(&:name)).to eq(%w[api exports:1])
      expect(LockManager::Admin.new(other).limiters.map(&:name)).to eq(["exports:2"])
    end
  end

  it "resets a limiter by name, every kind of it or one, and nothing else" do
    window = LockManager::Limiter.window("shared", 2, per: 86_400, locker: locker)
    rate = LockManager::Limiter.new("shared", rate: 1, per: 3600, burst: 2, locker: locker)
    [window, rate, limiters[:exports]].each { |limiter| use(limiter, 2) }

    expect(admin.reset_limiter("shared", kind: :window)).to be(true)
    expect([use(window, 3), use(rate, 1)]).to eq([2, 0])
    expect(admin.reset_limiter("shared")).to be(true)
    expect(admin.reset_limiter("shared")).to be(false)
    expect(use(rate, 3)).to eq(2)
    expect(admin.limiters.map(&:name)).to eq(["exports:1", "shared"])
  end

  it "refuses bad arguments before Redis" do
    expect { admin.reset_limiter("x", kind: :rate) }.to raise_error(ArgumentError, /kind must be one of/)
    expect { admin.reset_limiter("") }.to raise_error(ArgumentError, /name/)
    expect { admin.limiters("*", limit: 0) }.to raise_error(ArgumentError, /limit/)
  end

  describe "on a Redis Cluster", :topology do
    let(:cluster) { RedisCluster.shared }
    let(:locker) { LockManager::Locker.new(cluster: cluster.seed_urls, key_prefix: prefix) }

    it "lists the limiters of every master and resets each on its own" do
      names = cluster.keys_on_each_master(2, base: "limiter", prefix: prefix).values.flatten
      names.each { |name| use(LockManager::Limiter.window(name, 5, per: 86_400, locker: locker), 2) }

      expect(admin.limiters.map { |l| [l.name, l.used] }).to eq(names.sort.map { |name| [name, 2] })
      names.each { |name| expect(admin.reset_limiter(name)).to be(true) }
      expect(admin.limiters).to eq([])
    end
  end
end
