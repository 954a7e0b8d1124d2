# frozen_string_literal: true

require "spec_helper"
require_relative "../support/topologies"

# Sentinel and Cluster with every node on TLS only, client certificates required, replication (and
# the cluster bus) over TLS: the TLS settings reach the sentinels, the primary they name (before and
# after a failover), and every Cluster node the slot map names.
RSpec.describe "TLS through Sentinel and Cluster", :topology do
  before(:context) { @authority = TlsAuthority.new(Dir.mktmpdir("lock_manager-tls")) }
  after(:context) { FileUtils.rm_rf(@authority.dir) }

  let(:authority) { @authority }
  let(:client_settings) do
    cert, key = authority.issue("app-#{SecureRandom.hex(3)}")
    { tls_ca_file: authority.ca_file, tls_cert_file: cert, tls_key_file: key }
  end

  it "Sentinel: sentinels and primary over TLS; after the primary is killed, the new one, over TLS too",
     timeout: 60 do
    set = own_server(RedisSentinelSet, tls: authority)
    expect(set.sentinel_urls + [set.master_url]).to all(start_with("rediss://"))
    locker = LockManager::Locker.new(sentinels: set.sentinel_urls, sentinel_master: set.name,
                                     redis_url: set.master_url, key_prefix: prefix, **client_settings)
    first = set.primary
    expect(locker.nonblocking_lock("k") { first.admin.exists?("#{prefix}k") }.result).to be(true)
    no_certificate = LockManager::Locker.new(sentinels: set.sentinel_urls, sentinel_master: set.name,
                                             redis_url: set.master_url, tls_ca_file: authority.ca_file)
    expect { no_certificate.locked?("k") }.to raise_error(LockManager::TLSError, /client certificate/)

    set.kill_primary
    survivor = set.wait_for_failover
    expect(survivor).not_to eq(first)
    result = locker.blocking_lock("k", wait: 10) { survivor.admin.exists?("#{prefix}k") }
    expect(result).to be(true)
  end

  it "Cluster: every master, found through one seed's slot map, over TLS", timeout: 60 do
    cluster = own_server(RedisCluster, replicas: false, tls: authority)
    locker = LockManager::Locker.new(cluster: cluster.seed_urls.first(1), key_prefix: prefix, **client_settings)
    keys = cluster.keys_on_each_master(1, prefix: prefix)
    expect(keys.size).to eq(3)
    keys.each do |master, (key)|
      expect(locker.nonblocking_lock(key) { master.admin.exists?("#{prefix}#{key}") }.result).to be(true)
    end
    held = keys.values.flatten.map { |key| locker.try_lock(key, timeout: 30) }
    expect(LockManager::Admin.new(locker).locks.map(&:key).sort).to eq(keys.values.flatten.sort)
    held.each(&:release)
  end
end
