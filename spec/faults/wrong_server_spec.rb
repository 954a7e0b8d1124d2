# frozen_string_literal: true

require "spec_helper"
require_relative "../support/fault_helpers"

# Replies that mean "not the Redis to ask": each has an error a user can rescue apart, and the
# connection that got READONLY, MASTERDOWN or LOADING is dropped rather than pooled.
RSpec.describe "A Redis that cannot serve locks" do
  include FaultHelpers

  def admin_of(server)
    client_of(server, timeout: 5)
  end

  def expect_refusal(locker, error_class, reply)
    error, took = outcome_and_time { locker.nonblocking_lock("k") { :ran } }
    expect(error).to be_a(error_class)
    expect(error.message).to include('"k"', reply)
    expect(took).to be < 1
    error
  end

  it "a replica (READONLY): ReadOnlyError, a ConnectionError; the connection is dropped" do
    primary = start_server
    replica = start_server(args: ["--replicaof", "127.0.0.1", primary.port.to_s])
    eventually(timeout: 30) { admin_of(replica).info("replication")["master_link_status"] == "up" }
    locker = locker_on(replica, pool_size: 2)
    error = expect_refusal(locker, LockManager::ReadOnlyError, "READONLY")
    expect(error).to be_a(LockManager::ConnectionError)
    expect(error.message).to include("replica")
    expect(locker.pool_state).to eq([0, 0])
  end

  it "a replica that lost its primary, serving no stale data (MASTERDOWN): ReadOnlyError; dropped" do
    replica = own_server(FaultyRedisServer, args: ["--replicaof", "127.0.0.1", FreePort.pick.to_s,
                                                   "--replica-serve-stale-data", "no"], start: :start_answering)
    locker = locker_on(replica, pool_size: 2)
    expect_refusal(locker, LockManager::ReadOnlyError, "MASTERDOWN")
    expect(locker.pool_state).to eq([0, 0])
  end

  it "a Redis loading its data set (LOADING): LoadingError; dropped; a blocking wait rides it out" do
    server = start_server(appendonly: true, args: %w[--key-load-delay 50 --loading-process-events-interval-bytes 1024])
    admin = admin_of(server)
    admin.call("DEBUG", "POPULATE", 20_000) rescue admin.pipelined { |p| 20_000.times { |i| p.set("key:#{i}", i) } } # rubocop:disable Style/RescueModifier
    admin.call("BGREWRITEAOF")
    eventually { admin.info("persistence")["aof_rewrite_in_progress"] == "0" }
    server.kill
    server.start_answering
    locker = locker_on(server, pool_size: 2)
    expect_refusal(locker, LockManager::LoadingError, "LOADING")
    expect(locker.pool_state).to eq([0, 0])
    expect(locker.blocking_lock("k", timeout: 30) { :after_loading }).to eq(:after_loading)
  end

  describe "a Redis Cluster node" do
    # Two masters sharing the 16,384 slots, met: a key of the other's half is MOVED there.
    def cluster_of_two
      # Each bus port picked (reserved) too: port + 10000 lies in the kernel's ephemeral range, where a
      # connection's local port can hold it, and the node then exits at start.
      buses = Array.new(2) { FreePort.pick }
      nodes = buses.map do |bus|
        start_server(args: ["--cluster-enabled", "yes", "--cluster-node-timeout", "5000", "--cluster-port", bus.to_s])
      end
      nodes.each_with_index do |node, i|
        admin_of(node).call("CLUSTER", "ADDSLOTSRANGE", (i * 8192).to_s, ((i * 8192) + 8191).to_s)
      end
      admin_of(nodes[0]).call("CLUSTER", "MEET", "127.0.0.1", nodes[1].port.to_s, buses[1].to_s)
      eventually(timeout: 10) { nodes.all? { |n| admin_of(n).call("CLUSTER", "INFO").include?("cluster_state:ok") } }
      nodes
    end

    it "MOVED: ClusterError naming the reply; CLUSTERDOWN: ClusterDownError" do
      first, = cluster_of_two
      locker = locker_on(first)
      moved = (0..).lazy.map { |i| "k#{i}" }.find { |key| KeySlots.slot("#{prefix}#{key}") >= 8192 }
      error, = outcome_and_time { locker.nonblocking_lock(moved) { :ran } }
      expect(error).to be_a(LockManager::ClusterError)
      expect(error).not_to be_a(LockManager::ConnectionError)
      expect(error.message).to include("MOVED", "Cluster")

      lone = start_server(args: ["--cluster-enabled", "yes", "--cluster-port", FreePort.pick.to_s]) # no slot served
      error, = outcome_and_time { locker_on(lone).nonblocking_lock("k") { :ran } }
      expect(error).to be_a(LockManager::ClusterDownError)
      expect(error.message).to include("CLUSTERDOWN")
    end
  end

  # Redis writes "-ERR max number of clients reached" and closes: the reply reaches the gem only
  # when it arrives before the reset does (TooManyClientsError, a ConnectionError); otherwise the
  # reset is all there is to report.
  it "a Redis at maxclients: a ConnectionError at once" do
    server = start_server(args: %w[--maxclients 1])
    admin = admin_of(server)
    admin.ping # the one client it allows
    error, took = outcome_and_time { locker_on(server).nonblocking_lock("k") { :ran } }
    expect(error).to be_a(LockManager::ConnectionError)
    expect(error.message).to include("127.0.0.1:#{server.port}")
    expect(error.message).to include("maxclients") if error.is_a?(LockManager::TooManyClientsError)
    expect(took).to be < 1
  end

  describe "eviction" do
    def warnings(log)
      log.string.lines.grep(/maxmemory-policy/)
    end

    it "warns once per Locker that a lock can be evicted, unless maxmemory-policy is noeviction" do
      log = capture_log
      evicting = start_server(args: %w[--maxmemory-policy allkeys-lru])
      locker = locker_on(evicting)
      3.times { locker.nonblocking_lock("k") {} }
      expect(warnings(log).size).to eq(1)
      expect(warnings(log).first).to include("allkeys-lru", "noeviction", "127.0.0.1:#{evicting.port}")

      locker_on(start_server).nonblocking_lock("k") {} # noeviction, Redis's default
      expect(warnings(log).size).to eq(1)
    end

    it "stays silent, and works, where CONFIG is not allowed" do
      log = capture_log
      server = start_server(args: %w[--maxmemory-policy allkeys-lru])
      admin_of(server).call("ACL", "SETUSER", "app", "on", ">pw", "~*", "&*", "+@all", "-config")
      locker = LockManager::Locker.new(redis_url: "redis://app:pw@127.0.0.1:#{server.port}/0", key_prefix: prefix)
      expect(locker.nonblocking_lock("k") { :ran }.result).to eq(:ran)
      expect(warnings(log)).to eq([])
    end
  end
end
