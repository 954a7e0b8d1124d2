# frozen_string_literal: true

require "spec_helper"
require_relative "../support/topologies"

# The Cluster and Sentinel set-ups of spec/support/topologies.rb, checked with plain redis-rb: what
# the gem's topology specs take for granted.
RSpec.describe "Topology infrastructure", :topology do
  describe RedisCluster do
    let(:cluster) { RedisCluster.shared }

    it "has 3 masters with a linked replica each, and every slot served", timeout: 30 do
      expect(cluster.masters.size).to eq(3)
      expect(cluster.replicas.size).to eq(3)
      cluster.masters.each do |master|
        replica = cluster.replica_of(master)
        expect(client_of(replica).info("replication")).to include("role" => "slave", "master_link_status" => "up")
        expect(client_of(master).info("replication")).to include("role" => "master", "connected_slaves" => "1")
      end
      cluster.nodes.each do |node|
        expect(client_of(node).call("CLUSTER", "INFO")).to include("cluster_state:ok", "cluster_slots_ok:16384")
      end
      expect(cluster.seed_urls).to match_array(cluster.masters.map { |master| "redis://127.0.0.1:#{master.port}" })
    end

    it "serves a key on the master of its slot, and redirects it from the others", timeout: 10 do
      cluster.keys_on_each_master(2, prefix: prefix).each do |master, keys|
        keys.each do |key|
          expect(cluster.master_for_slot(KeySlots.slot(prefix + key))).to eq(master)
          expect(client_of(master).set(prefix + key, "here")).to eq("OK")
          expect(client_of(master).get(prefix + key)).to eq("here")
          other = (cluster.masters - [master]).first
          expect { client_of(other).get(prefix + key) }
            .to raise_error(Redis::CommandError, /\AMOVED \d+ 127.0.0.1:#{master.port}\b/) # redis-rb 5 adds the URL
        end
      end
      master = cluster.masters.last
      key = cluster.key_in_slot_of(master, "k", prefix: prefix)
      expect(cluster.master_for_slot(KeySlots.slot(prefix + key))).to eq(master)
    end

    it "promotes a killed master's replica, and takes the master back as a replica", timeout: 40 do
      cluster = own_server(RedisCluster)
      master = cluster.masters[1]
      replica = cluster.replica_of(master)
      key = cluster.key_in_slot_of(master, "survivor")
      writer = client_of(master)
      writer.set(key, "kept")
      eventually(timeout: 15) { writer.wait(1, 500) == 1 } # on the replica before the master dies

      took = elapsed do
        cluster.kill_master(master)
        expect(cluster.wait_for_failover(master, timeout: 15)).to eq(replica)
      end
      expect(took).to be < 15
      expect(cluster.masters).to include(replica)
      expect(cluster.masters).not_to include(master)
      expect(client_of(replica).get(key)).to eq("kept")

      cluster.restart(master)
      expect(client_of(master).call("ROLE").first(3)).to eq(["slave", "127.0.0.1", replica.port])
      expect(cluster.replica_of(replica)).to eq(master)
      expect { client_of(master).set(key, "x") }.to raise_error(Redis::CommandError, /\AMOVED/)
    end

    it "migrates a slot step by step, its keys asked for on the target meanwhile", timeout: 30 do
      cluster = own_server(RedisCluster)
      slot = 777
      keys = cluster.keys_in_slot(slot, 150, base: "migrating")
      source = cluster.master_for_slot(slot)
      target = (cluster.masters - [source]).first
      keys.each { |key| client_of(source).set(key, key) }

      cluster.begin_migration(slot, to: target)
      expect(client_of(source).get(keys.first)).to eq(keys.first) # still there: served where it is
      expect(cluster.migrate_keys(slot)).to eq(150)
      expect { client_of(source).get(keys.first) }.to raise_error(Redis::CommandError, /\AASK #{slot} /)
      asking = client_of(target)
      asking.call("ASKING")
      expect(asking.get(keys.first)).to eq(keys.first)

      cluster.finish_migration(slot)
      expect(cluster.master_for_slot(slot)).to eq(target)
      expect(client_of(target).call("CLUSTER", "COUNTKEYSINSLOT", slot)).to eq(150)
      expect(client_of(source).call("CLUSTER", "COUNTKEYSINSLOT", slot)).to eq(0)
      expect(client_of(target).mget(*keys)).to eq(keys)
    end
  end

  describe RedisSentinelSet do
    it "has a primary, a linked replica and 3 sentinels that agree", timeout: 20 do
      set = RedisSentinelSet.shared
      expect(set.sentinel_urls.size).to eq(3)
      set.sentinel_urls.each do |url|
        sentinel = Redis.new(url: url, timeout: 2).tap { |client| topology_clients << client }
        expect(sentinel.call("SENTINEL", "GET-MASTER-ADDR-BY-NAME", "mymaster"))
          .to eq(["127.0.0.1", set.primary.port.to_s])
      end
      primary = Redis.new(url: set.master_url, timeout: 2).tap { |client| topology_clients << client }
      primary.set("#{prefix}written", "on the primary")
      eventually(timeout: 15) { primary.wait(1, 500) == 1 }
      expect(client_of(set.replica).get("#{prefix}written")).to eq("on the primary")
    end

    it "fails over when the primary is killed, and takes the old one back as a replica", timeout: 45 do
      set = own_server(RedisSentinelSet, name: "lockmaster", password: "data-pw", sentinel_password: "sentinel-pw")
      old_primary = set.primary
      old_replica = set.replica
      expect(set.master_url).to eq("redis://:data-pw@127.0.0.1:#{old_primary.port}/0")
      expect(set.sentinel_urls).to all(start_with("redis://:sentinel-pw@127.0.0.1:"))
      expect { Redis.new(url: "redis://127.0.0.1:#{set.sentinels.first.port}").tap { |c| topology_clients << c }.ping }
        .to raise_error(Redis::CommandError, /NOAUTH/)

      took = elapsed do
        expect(set.kill_primary).to eq(old_primary)
        expect(set.wait_for_failover(timeout: 20)).to eq(old_replica)
      end
      expect(took).to be < 20
      expect(set.primary).to eq(old_replica)
      expect(client_of(old_replica).call("ROLE").first).to eq("master")

      set.restart_old_primary
      expect(set.wait_until_replica(old_primary, timeout: 30)).to eq(old_primary)
      expect(client_of(old_primary).call("ROLE").first(3)).to eq(["slave", "127.0.0.1", old_replica.port])
      expect(set.replica).to eq(old_primary)
    end

    it "pauses and resumes a node", timeout: 10 do
      set = RedisSentinelSet.shared
      node = set.replica
      set.pause(node)
      begin
        expect { Redis.new(url: node.url, timeout: 0.3).tap { |c| topology_clients << c }.ping }
          .to raise_error(Redis::TimeoutError)
      ensure
        set.resume(node)
      end
      expect(client_of(node).ping).to eq("PONG")
    end
  end

  describe TopologyNode do
    it "dies with the process that started it, even by SIGKILL", timeout: 15 do
      script = "require #{File.expand_path("../support/topologies", __dir__).inspect}; " \
               "node = TopologyNode.new.start; puts node.pid, File.dirname(node.log_file); $stdout.flush; sleep"
      reader, writer = IO.pipe
      starter = Process.spawn(RbConfig.ruby, "-e", script, out: writer)
      writer.close
      server = Integer(reader.gets)
      dir = reader.gets.chomp
      Process.kill(:KILL, starter)
      Process.wait(starter)
      eventually(timeout: 5) do
        Process.kill(0, server)
        false
      rescue Errno::ESRCH
        true
      end
    ensure
      reader&.close
      FileUtils.rm_rf(dir) if dir
    end
  end
end
