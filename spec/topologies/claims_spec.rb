# frozen_string_literal: true

require "spec_helper"
require_relative "../support/topologies"

# Job uniqueness rests on claims (a lock held by a job's id, taken in bulk, adopted by whichever
# process runs the job, kept for a retry, released by id, one or many at a time): the same on a
# Cluster, with keys on every master, and through Sentinel.
RSpec.describe "Claims (job uniqueness) on Cluster and Sentinel", :topology do
  def exercise(locker, keys, value_of)
    jids = keys.map { SecureRandom.hex(12) }
    expect(locker.claim(keys, jids, [60] * keys.size)).to all(be_a(Integer))
    expect(locker.claim(keys, keys.map { "other" }, [60] * keys.size)).to eq(jids)
    expect(keys.map { |key| value_of.call(key) }).to eq(jids)

    lock = locker.adopt(keys.first, jids.first, timeout: 5)
    expect(lock).to be_a(LockManager::Lock)
    expect(lock.keep(120)).to be(true)
    expect(locker.adopt(keys.first, "another-jid", timeout: 5)).to eq(jids.first)
    expect(locker.release_claim(keys.first, jids.first)).to be(true)
    rest = keys.drop(1)
    expect(locker.release_claims(rest, rest.map { "other" })).to all(be(false)) # never another id's
    expect(locker.release_claims(rest, jids.drop(1))).to all(be(true))
    expect(keys.map { |key| locker.holder(key) }).to all(be_nil)
    locker.nonblocking_lock(keys.last, limit: 2) { expect(locker.holder(keys.last)).to be_nil } # N holders, not one
  end

  it "claims keys on all 3 masters in one call, names their holders, adopts, keeps and releases by id",
     timeout: 60 do
    cluster = RedisCluster.shared
    keys = cluster.keys_on_each_master(2, base: "claim", prefix: prefix).values.flatten
    locker = LockManager::Locker.new(cluster: cluster.seed_urls, key_prefix: prefix)
    value_of = ->(key) { node_client(cluster.master_for_slot(KeySlots.slot(prefix + key))).get(prefix + key) }

    exercise(locker, keys, value_of)
  end

  it "claims, adopts, keeps and releases through Sentinel, on its primary", timeout: 60 do
    set = RedisSentinelSet.shared
    locker = LockManager::Locker.new(sentinels: set.sentinel_urls, sentinel_master: set.name,
                                     redis_url: set.master_url, key_prefix: prefix)
    primary = Redis.new(url: set.master_url)

    exercise(locker, %w[a b c], ->(key) { primary.get(prefix + key) })
  ensure
    primary&.close
  end
end
