# frozen_string_literal: true

require_relative "../../spec/support/fault_helpers"
require_relative "../../spec/support/topologies"

TopologyNode.own_session = true # every redis-server a service of its own, as the standalone one

module Histories
  # Where a row's locks live: one redis-server (Standalone), a primary with a replica and three
  # sentinels (Sentinel), or a Cluster of 3 masters with a replica each (Cluster). The topologies are
  # spec/support/topologies.rb's, as spec/topologies builds them. Each says how the clients' Locker
  # reaches it, gives a plain client of the lock keys (for the faults' look at who holds what) and
  # lists the keys left once the clients are done.
  module Backends
    module_function

    def for(row)
      case row.topology
      when :sentinel then Sentinel.new
      when :cluster then Cluster.new
      else Standalone.new(appendonly: row.appendonly)
      end
    end

    # One FaultyRedisServer, restarted in place by the kill faults.
    class Standalone
      attr_reader :server

      def initialize(appendonly:)
        @server = FaultyRedisServer.new(appendonly: appendonly)
      end

      def start
        @server.start
        self
      end

      # @param url [String, nil] another way in (a partition row's proxy)
      def locker_options(url = nil)
        { redis_url: url || @server.url }
      end

      def admin
        @admin ||= Redis.new(url: @server.url, timeout: 5)
      end

      def keys
        admin.keys("*")
      end

      def shutdown
        @admin&.close
        @server.shutdown
      end
    end

    # RedisSentinelSet: the clients find the primary through the sentinels, as the gem's
    # `sentinels:` and `sentinel_master:` settings say (spec/topologies/sentinel_faults_spec.rb).
    class Sentinel
      attr_reader :topology

      def start
        @topology = RedisSentinelSet.new.start
        self
      end

      def locker_options(_url = nil)
        { sentinels: @topology.sentinel_urls, sentinel_master: @topology.name }
      end

      # The primary's own client: the faults look before they kill it.
      def admin
        @topology.primary.admin
      end

      def keys
        @topology.primary.admin.keys("*")
      end

      def shutdown
        @topology&.shutdown
      end
    end

    # RedisCluster: the clients know its masters as seeds (the gem's `cluster:` setting,
    # spec/topologies/cluster_faults_spec.rb).
    class Cluster
      attr_reader :topology

      def start
        @topology = RedisCluster.new.start
        @seeds = @topology.seed_urls
        self
      end

      def locker_options(_url = nil)
        { cluster: @seeds }
      end

      def admin
        @admin ||= @topology.cluster_client
      end

      # On every master serving slots now (a dead one's keys died with it).
      def keys
        @topology.masters.flat_map { |master| master.admin.keys("*") }
      end

      def shutdown
        @admin&.close
        @topology&.shutdown
      end
    end
  end
end
