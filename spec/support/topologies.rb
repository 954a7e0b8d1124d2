# frozen_string_literal: true

require "fileutils"
require "io/nonblock"
require "redis"
require_relative "redis_server"
require_relative "key_slots"

# Real Redis Cluster and Sentinel set-ups for the specs: RedisCluster (3 masters, 1 replica each)
# and RedisSentinelSet (a primary, a replica, 3 sentinels). Both converge by gossip in their own
# time, so every step that changes them has a bounded wait for the state it leads to.

# Polling for the topologies: a node that errs or does not answer meanwhile counts as "not yet".
module TopologyWaiting
  POLL = 0.05

  private

  # @return the block's first truthy value
  def wait_until(what, timeout:)
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout
    loop do
      value = begin
        yield
      rescue Redis::BaseError
        nil
      end
      return value if value
      raise "#{what}: not within #{timeout} s" if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline

      sleep POLL
    end
  end

  # A replica whose link to its primary is up.
  def link_up?(node)
    node.admin.info("replication")["master_link_status"] == "up"
  end
end

# One topology per suite, for the examples that only read and write through it.
module SharedTopology
  MUTEX = Mutex.new

  # Started on first use; shut down at exit by the process that started it (not by a fork of it).
  # Slow to declare a node down (SHARED_OPTIONS): nothing fails it on purpose, so a node that a loaded
  # machine stalls for a second must not fail over in the middle of the suite.
  def shared
    MUTEX.synchronize do
      @shared ||= new(**self::SHARED_OPTIONS).start.tap do |topology|
        owner = Process.pid
        at_exit { topology.shutdown if Process.pid == owner }
      end
    end
  end
end

# A redis-server of a topology, which may be killed, paused and started again on the same port and
# directory (a cluster node finds its nodes.conf there). It stays in the suite's process group, so a
# Ctrl-C reaches it, as RedisServer's do.
class TopologyNode < RedisServer
  # redis-server runs under a shell that waits for it: this process is not its parent, so a SIGSTOP
  # sends no SIGCHLD into whichever thread of the suite is reading from Redis (see FaultyRedisServer).
  # The shell's watchdog SIGKILLs it once fd 3, a pipe whose write end only the suite holds, reads
  # EOF: when the suite dies, even by SIGKILL, with no at_exit to run.
  SCRIPT = <<~SH
    "${REDIS_SERVER:-redis-server}" "$@" 3<&- &
    server=$!
    (read -r _ <&3; kill -9 "$server" 2>/dev/null) &
    watchdog=$!
    wait "$server"
    kill "$watchdog" 2>/dev/null
  SH

  attr_reader :pid

  class << self
    # For benchmarks: each server in a session of its own (see RedisServer#initialize).
    attr_accessor :own_session
  end

  # @param args [Array<String>] more redis-server options
  # @param tls [TlsAuthority, nil] serve TLS only, and replicate over TLS (see RedisServer)
  def initialize(args: [], password: nil, tls: nil)
    super(password: password, tls: tls || false)
    @args = args
  end

  def log_file
    File.join(@dir, "redis.log")
  end

  # Spawns redis-server without waiting for it (see #await): a topology starts its nodes all at once.
  def launch
    raise "port #{port} is already running" if @shell

    reader, @lifeline = IO.pipe
    reader.nonblock = false # Ruby's pipes are non-blocking: the watchdog's read would end at once
    command = ["sh", "-c", SCRIPT, "sh", *arguments]
    command.unshift(SETSID) if TopologyNode.own_session && File.executable?(SETSID)
    @shell = Process.spawn(*command, 3 => reader, out: File::NULL, err: File::NULL)
    self
  ensure
    reader&.close
  end

  # Until it answers PING.
  def await(timeout: 10)
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout
    until answering?
      raise "redis-server on port #{port} exited: #{File.read(log_file).lines.last(3).join}" if exited?
      raise "redis-server did not start on port #{port}" if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline

      sleep 0.01
    end
    @pid = admin.info("server").fetch("process_id").to_i
    self
  end

  def start
    launch.await
  end

  def running?
    !@shell.nil?
  end

  # SIGKILL: no shutdown, nothing saved but what the server already wrote (nodes.conf, sentinel.conf).
  def stop
    return unless @shell

    kill_server
    @lifeline.close
    reap_shell
    @shell = @pid = nil
    @admin&.close
    @admin = nil
  end

  # A client kept for the topology's own questions (ROLE, CLUSTER SLOTS, SENTINEL ...).
  def admin
    @admin ||= client
  end

  def inspect
    "#<#{self.class.name} 127.0.0.1:#{port}#{running? ? "" : " (down)"}>"
  end

  private

  def arguments
    args = base_arguments
    args += ["--requirepass", @password, "--masterauth", @password] if @password
    args += [*tls_arguments, "--tls-replication", "yes"] if @tls
    args + @args
  end

  def kill_server
    Process.kill(:KILL, @pid) if @pid
  rescue Errno::ESRCH
    nil # it died on its own (a Ctrl-C reaches it too); the watchdog's EOF is enough
  end

  def reap_shell
    Process.wait(@shell)
  rescue Errno::ECHILD
    nil # reaped already (it exited on its own, see #exited?)
  end

  def answering?
    client.tap(&:ping).close
    true
  rescue Redis::BaseConnectionError, Redis::CommandError
    false
  end

  def exited?
    return false unless Process.wait(@shell, Process::WNOHANG)

    @lifeline.close
    @shell = nil
    true
  end
end

# A node of a RedisCluster: its cluster bus on a free port of its own (port + 10000 may be taken,
# or beyond 65535).
class ClusterNode < TopologyNode
  attr_reader :bus_port

  # @param node_timeout [Integer] ms without an answer before a node is failing (cluster-node-timeout)
  # @param tls [TlsAuthority, nil] clients, replication and the cluster bus over TLS only
  def initialize(node_timeout: 1000, tls: nil)
    super(tls: tls)
    @node_timeout = node_timeout
    @bus_port = FreePort.pick # never the node's own: that one is reserved already
  end

  def shutdown
    super
    FreePort.release(bus_port)
  end

  # Its node ID, which nodes.conf keeps across restarts.
  def id
    @id ||= admin.call("CLUSTER", "MYID")
  end

  private

  def arguments
    super + ["--cluster-enabled", "yes", "--cluster-port", bus_port.to_s,
             "--cluster-config-file", File.join(@dir, "nodes.conf"), "--cluster-node-timeout", @node_timeout.to_s,
             "--cluster-require-full-coverage", "no", # the other masters serve on while one fails over
             "--cluster-replica-validity-factor", "0", # a replica fails over however long its link was down
             "--cluster-allow-replica-migration", "no", # every master keeps the replica it was given
             *(@tls ? %w[--tls-cluster yes] : [])]
  end
end

# A sentinel: redis-server --sentinel with a config file of its own, which it rewrites with what it
# learns (other sentinels, replicas, failovers) and reads again when restarted.
class SentinelNode < TopologyNode
  # Sentinel's periods, shortened (SENTINEL DEBUG, not kept in its config file) so that the specs wait
  # seconds, not tens of seconds: INFO of every instance each second, not each 10 s (a replica or
  # a restarted old primary is seen sooner); hellos each 0.5 s, not 2 s (sentinels find each other
  # sooner, and a restarted old primary is made a replica after 4 periods, not 8 s); and 5 s of TILT,
  # not 30 s, after the sentinel itself was paused or starved of CPU for 2 s.
  PERIODS = { "info-period" => 1000, "publish-period" => 500, "tilt-period" => 5000 }.freeze

  def initialize(config, password: nil, tls: nil)
    super(password: password, tls: tls)
    @config = config
  end

  def await(...)
    super.tap { admin.call("SENTINEL", "DEBUG", *PERIODS.flatten) }
  end

  private

  def arguments
    path = File.join(@dir, "sentinel.conf")
    unless File.exist?(path)
      File.write(path, "port #{port}\nbind 127.0.0.1\ndir #{@dir}\nlogfile #{log_file}\n#{tls_config}#{@config}")
    end
    [path, "--sentinel"]
  end

  # Clients, other sentinels and the data nodes over TLS only, with this node's certificate.
  def tls_config
    return "" unless @tls

    "port 0\ntls-port #{port}\ntls-cert-file #{@server_cert[0]}\ntls-key-file #{@server_cert[1]}\n" \
      "tls-ca-cert-file #{ca_file}\ntls-replication yes\n"
  end
end

# What the nodes of a RedisCluster say about it.
module ClusterViews
  private

  # Every live node in cluster_state:ok, with the same full slot map, whose masters are all live.
  def agreed?
    live = live_nodes
    return false unless live.all? { |node| node.admin.call("CLUSTER", "INFO").include?("cluster_state:ok") }

    maps = live.map { |node| slot_map(node) }.uniq
    maps.size == 1 && full_and_live?(maps.first, live.map(&:port))
  end

  def full_and_live?(map, live_ports)
    map.sum { |first, last, _| last - first + 1 } == KeySlots::SLOTS &&
      map.all? { |_, _, port| live_ports.include?(port) }
  end

  # [[first slot, last slot, master port]] as `node` sees them, by first slot.
  def slot_map(node)
    node.admin.call("CLUSTER", "SLOTS").map { |first, last, master| [first, last, master[1]] }.sort
  end

  def owner_port(map, slot)
    map.find { |first, last, _| slot.between?(first, last) }&.last
  end

  # A live node that answers: whose view of the cluster is taken.
  def any_node
    live_nodes.find do |node|
      node.admin.ping
    rescue Redis::BaseError
      false
    end || raise("no node of #{inspect} answers")
  end

  def node_at(port)
    nodes.find { |node| node.port == port }
  end

  # The nodes `node` knows, out of handshake and connected.
  def known_nodes(node)
    node.admin.call("CLUSTER", "NODES").lines.count do |line|
      fields = line.split
      !fields[2].match?(/handshake|noaddr/) && fields[7] == "connected"
    end
  end
end

# Slot migration, one documented step at a time, so that an example can act between the steps
# (https://redis.io/commands/cluster-setslot/).
module ClusterMigration
  MIGRATE_BATCH = 100

  # Marks `slot` importing on `to` and migrating on the master serving it now.
  def begin_migration(slot, to:)
    from = master_for_slot(slot)
    raise "slot #{slot} is already served by #{to.inspect}" if from == to

    to.admin.call("CLUSTER", "SETSLOT", slot, "IMPORTING", from.id)
    from.admin.call("CLUSTER", "SETSLOT", slot, "MIGRATING", to.id)
    (@migrations ||= {})[slot] = [from, to]
  end

  # Moves the slot's keys to the target in batches (MIGRATE ... KEYS); returns how many it moved.
  def migrate_keys(slot)
    from, to = migration(slot)
    moved = 0
    loop do
      keys = from.admin.call("CLUSTER", "GETKEYSINSLOT", slot, MIGRATE_BATCH)
      return moved if keys.empty?

      from.admin.call("MIGRATE", "127.0.0.1", to.port, "", 0, 5000, "KEYS", *keys)
      moved += keys.size
    end
  end

  # Assigns the slot to the target: on the target first, then the source, then the other masters;
  # returns once every live node serves redirects for it to the target.
  def finish_migration(slot, timeout: 10)
    from, to = migration(slot)
    ([to, from] + (masters - [to, from])).each { |node| node.admin.call("CLUSTER", "SETSLOT", slot, "NODE", to.id) }
    @migrations.delete(slot)
    wait_until("slot #{slot} moved to #{to.inspect}", timeout: timeout) do
      live_nodes.all? { |node| owner_port(slot_map(node), slot) == to.port }
    end
  end

  def migrate_slot(slot, to:)
    begin_migration(slot, to: to)
    migrate_keys(slot)
    finish_migration(slot)
  end

  private

  def migration(slot)
    (@migrations || {}).fetch(slot) { raise "slot #{slot} is not migrating (begin_migration first)" }
  end
end

# Keys for examples that spread over the masters. The slot that matters is that of the key the
# server sees, `prefix + key` (the gem's internal keys of a lock share that slot).
module ClusterKeys
  # A key "base:N" whose slot (with `prefix`) `master` serves now.
  def key_in_slot_of(master, base = "key", prefix: "")
    owners = { master => slot_ranges_of(master) }
    candidate_keys(base).find { |key| owner_among(owners, prefix + key) }
  end

  # @return [Hash{ClusterNode => Array<String>}] `count` keys "base:N" for each master, in #masters order
  def keys_on_each_master(count, base: "key", prefix: "")
    owners = masters.to_h { |master| [master, slot_ranges_of(master)] }
    keys = owners.transform_values { [] }
    candidate_keys(base).each do |key|
      list = keys.fetch(owner_among(owners, prefix + key), []) # [] for a slot no master serves
      list << key if list.size < count
      return keys if keys.values.all? { |full| full.size == count }
    end
  end

  # `count` keys in `slot` by a hash tag ("base:{tag}:N"); `prefix` and `base` must hold no "{".
  def keys_in_slot(slot, count, base: "key")
    Array.new(count) { |n| "#{base}:{#{KeySlots.tag(slot)}}:#{n}" }
  end

  def slot_ranges_of(master)
    slot_map(any_node).select { |_, _, port| port == master.port }.map { |first, last, _| first..last }
  end

  private

  def candidate_keys(base)
    (0..).lazy.map { |n| "#{base}:#{n}" }
  end

  # @param owners [Hash{ClusterNode => Array<Range>}]
  def owner_among(owners, key)
    slot = KeySlots.slot(key)
    owners.find { |_, ranges| ranges.any? { |range| range.cover?(slot) } }&.first
  end
end

# Faults of a RedisCluster: nodes killed with SIGKILL and restarted with their nodes.conf, as a
# crashed and rebooted server would be, or paused.
module ClusterFaults
  # SIGKILL: the other nodes find out by gossip (see #wait_for_failover).
  def kill_master(master)
    @killed_slots[master] = slot_ranges_of(master).first&.first
    kill(master)
  end

  def kill(node)
    node.stop
  end

  # Until every live node is in cluster_state:ok and agrees on a full slot map without the dead
  # node; returns the master now serving its (first) slots.
  def wait_for_failover(old_master, timeout: 15)
    wait_until("failover of #{old_master.inspect}", timeout: timeout) { agreed? }
    slot = @killed_slots.delete(old_master)
    slot && master_for_slot(slot)
  end

  # Starts a killed node again on its port and directory: it rejoins as a replica (of whoever
  # serves its old slots now).
  def restart(node, wait: true)
    node.start
    wait ? wait_until_replica(node) : node
  end

  def wait_until_replica(node, timeout: 15)
    wait_until("#{node.inspect} a replica", timeout: timeout) do
      node.admin.call("ROLE")[0] == "slave" && link_up?(node) && agreed?
    end
    node
  end
end

# SIGSTOP and SIGCONT of a topology's node: it keeps its sockets and answers nothing (a paused
# master or primary is failed over after about a second).
module NodePausing
  def pause(node)
    node.pause
  end

  def resume(node)
    node.resume
  end
end

# A Redis Cluster of 3 masters with 1 replica each, on loopback.
class RedisCluster
  include TopologyWaiting
  include ClusterViews
  include ClusterMigration
  include ClusterKeys
  include ClusterFaults
  include NodePausing
  extend SharedTopology

  SLOTS = KeySlots::SLOTS
  SHARED_OPTIONS = { node_timeout: 5000 }.freeze

  # @return [Array<ClusterNode>] every node, up or down: the first half were masters at start
  attr_reader :nodes

  # @param replicas [Boolean] one replica per master (false: masters only, for benchmarks that
  #   compare a Cluster's routing with one server's)
  # @param node_timeout [Integer] cluster-node-timeout in ms: how soon a replica takes a dead master's place
  # @param tls [TlsAuthority, nil] every node on TLS only, with client certificates
  def initialize(masters: 3, replicas: true, node_timeout: 1000, tls: nil)
    @masters = masters
    @nodes = Array.new(replicas ? masters * 2 : masters) { ClusterNode.new(node_timeout: node_timeout, tls: tls) }
    @killed_slots = {}
  end

  def start(timeout: 15)
    started = false
    nodes.each(&:launch)
    nodes.each(&:await)
    form
    wait_until("cluster formed", timeout: timeout) { formed? }
    started = true
    self
  ensure
    shutdown unless started
  end

  def shutdown
    nodes.each(&:shutdown)
  end

  def live_nodes
    nodes.select(&:running?)
  end

  # The masters serving slots now, by their first slot (a promoted replica takes its master's place).
  def masters
    slot_map(any_node).map(&:last).uniq.map { |port| node_at(port) }
  end

  # The live nodes that serve no slot.
  def replicas
    live_nodes - masters
  end

  def seed_urls
    masters.map { |master| "#{master.scheme}://127.0.0.1:#{master.port}" }
  end

  # A cluster-mode redis-rb client, for looking at what the gem wrote.
  def cluster_client
    Redis.new(cluster: seed_urls, timeout: 2)
  end

  def client_for(node)
    node.client
  end

  # The node serving `slot` now, as a live node's CLUSTER SLOTS says.
  def master_for_slot(slot)
    node_at(owner_port(slot_map(any_node), slot))
  end

  # The live replica whose master is `master`, or nil.
  def replica_of(master)
    live_nodes.find do |node|
      role = node.admin.call("ROLE")
      role[0] == "slave" && role[2].to_i == master.port
    end
  end

  def inspect
    "#<RedisCluster #{nodes.map(&:port).join(",")}>"
  end

  private

  # Slots split evenly over the first half of the nodes, distinct config epochs (as redis-cli
  # --cluster create sets them), every node met through the first, then each replica given its master.
  def form
    first_masters = nodes.first(@masters)
    first_masters.each_with_index do |node, n|
      node.admin.call("CLUSTER", "ADDSLOTSRANGE", n * SLOTS / first_masters.size,
                      ((n + 1) * SLOTS / first_masters.size) - 1)
    end
    nodes.each_with_index { |node, n| node.admin.call("CLUSTER", "SET-CONFIG-EPOCH", n + 1) }
    nodes.drop(1).each { |node| nodes.first.admin.call("CLUSTER", "MEET", "127.0.0.1", node.port, node.bus_port) }
    wait_until("every node met", timeout: 10) { nodes.all? { |node| known_nodes(node) == nodes.size } }
    nodes.drop(@masters).zip(first_masters) do |replica, master|
      replica.admin.call("CLUSTER", "REPLICATE", master.id)
    end
  end

  # Agreed, and every master with a replica whose link is up.
  def formed?
    agreed? && masters.size == @masters &&
      (nodes.size == @masters || masters.all? { |master| (replica = replica_of(master)) && link_up?(replica) })
  end
end

# Faults of a RedisSentinelSet: its primary killed with SIGKILL and restarted, nodes paused.
module SentinelFaults
  # SIGKILL of the current primary; returns it.
  def kill_primary
    @killed = primary
    kill(@killed)
    @killed
  end

  def kill(node)
    node.stop
  end

  # Until every live sentinel names the other data node as master and it says so itself; returns it.
  def wait_for_failover(old_primary = @killed, timeout: 20)
    survivor = (data_nodes - [old_primary]).first
    wait_until("failover to #{survivor.inspect}", timeout: timeout) do
      sentinels.select(&:running?).all? { |sentinel| master_port(sentinel) == survivor.port } &&
        survivor.admin.call("ROLE")[0] == "master"
    end
    survivor
  end

  # Starts the killed primary again, on its port, as a master (as its own config would): the
  # sentinels make it a replica of the new primary, 2-3 s later (see #wait_until_replica).
  def restart_old_primary
    node = @killed || raise("no primary was killed")
    @killed = nil
    node.start
  end

  # Until `node` replicates the current primary with its link up, and no sentinel sees it down.
  def wait_until_replica(node, timeout: 30)
    wait_until("#{node.inspect} a replica", timeout: timeout) do
      role = node.admin.call("ROLE")
      role[0] == "slave" && role[2].to_i == primary.port && link_up?(node) &&
        sentinels.select(&:running?).all? { |sentinel| healthy_replica?(sentinel, node) }
    end
    node
  rescue RuntimeError => e
    raise e, "#{e.message}\n#{replica_views(node)}"
  end

  # What the node and each sentinel say of it, and the end of their logs: why it is not a replica yet.
  def replica_views(node)
    [answer_of(node) { |admin| "#{node.inspect} ROLE #{admin.call("ROLE").inspect}" },
     *sentinels.select(&:running?).map { |sentinel| sentinel_view(sentinel, node) }].join("\n")
  end

  def sentinel_view(sentinel, node)
    seen = answer_of(sentinel) do
      replica_entry(sentinel, node)&.slice("flags", "master-link-status", "role-reported")
    end
    log = File.exist?(sentinel.log_file) ? File.read(sentinel.log_file).lines.last(12).join : ""
    "sentinel #{sentinel.port} sees #{seen.inspect}; its log ends:\n#{log}"
  end

  def answer_of(node)
    yield node.admin
  rescue Redis::BaseError => e
    e.message
  end
end

# A primary, a replica and 3 sentinels (quorum 2) watching them, on loopback.
class RedisSentinelSet
  include TopologyWaiting
  include SentinelFaults
  include NodePausing
  extend SharedTopology

  SENTINELS = 3
  SHARED_OPTIONS = { down_after: 5000 }.freeze

  attr_reader :name, :sentinels

  # @param password [String, nil] requirepass and masterauth of the data nodes (sentinel auth-pass)
  # @param sentinel_password [String, nil] requirepass of the sentinels (sentinel sentinel-pass)
  # @param down_after [Integer] ms without an answer before the sentinels fail the primary over. A
  #   sentinel starts that clock for a new primary when a failover names it; on a loaded machine its
  #   first PONG can take over a second, and a second failover would follow the first.
  # @param tls [TlsAuthority, nil] every node, sentinels too, on TLS only with client certificates
  def initialize(name: "mymaster", password: nil, sentinel_password: nil, down_after: 2000, tls: nil)
    @name = name
    @down_after = down_after
    @password = password
    @sentinel_password = sentinel_password
    @data_nodes = Array.new(2) { TopologyNode.new(password: password, tls: tls) }
    @sentinels = Array.new(SENTINELS) { SentinelNode.new(sentinel_config, password: sentinel_password, tls: tls) }
  end

  # The replica is linked before the sentinels start: a sentinel asks a master's INFO for its
  # replicas at once, then each second only (see SentinelNode::PERIODS).
  def start(timeout: 15)
    started = false
    start_data_nodes
    sentinels.each(&:launch)
    sentinels.each(&:await)
    wait_until("sentinels ready", timeout: timeout) { sentinels_ready? }
    started = true
    self
  ensure
    shutdown unless started
  end

  def shutdown
    (@data_nodes + sentinels).each(&:shutdown)
  end

  # The data nodes, primary or replica, up or down.
  def data_nodes
    @data_nodes.dup
  end

  def sentinel_urls
    credentials = @sentinel_password ? ":#{@sentinel_password}@" : ""
    sentinels.map { |sentinel| "#{sentinel.scheme}://#{credentials}127.0.0.1:#{sentinel.port}" }
  end

  def master_url
    primary.url
  end

  # The node a sentinel names as master now.
  def primary
    sentinel = sentinels.find(&:running?)
    @data_nodes.find { |node| node.port == master_port(sentinel) }
  end

  # The other data node (it may be down).
  def replica
    (@data_nodes - [primary]).first
  end

  # A redis-rb client of a data node or a sentinel (closed by the caller).
  def client_for(node)
    node.client
  end

  # A redis-rb client that finds the master through the sentinels.
  def sentinel_client(role: :master)
    addresses = sentinels.map { |s| { host: "127.0.0.1", port: s.port, password: @sentinel_password }.compact }
    Redis.new(url: "redis://#{name}", sentinels: addresses, role: role, password: @password, timeout: 2)
  end

  def inspect
    "#<RedisSentinelSet #{name} #{@data_nodes.map(&:port).join(",")} sentinels #{sentinels.map(&:port).join(",")}>"
  end

  private

  def start_data_nodes
    first, second = @data_nodes.each(&:launch).each(&:await)
    second.admin.call("REPLICAOF", "127.0.0.1", first.port)
    wait_until("replica linked", timeout: 10) do
      link_up?(second) && first.admin.info("replication")["slave0"].to_s.include?("state=online")
    end
  end

  def sentinel_config
    lines = ["sentinel monitor #{name} 127.0.0.1 #{@data_nodes.first.port} 2",
             "sentinel down-after-milliseconds #{name} #{@down_after}",
             "sentinel failover-timeout #{name} 3000",
             "sentinel parallel-syncs #{name} 1"]
    lines << "sentinel auth-pass #{name} #{quote(@password)}" if @password
    if @sentinel_password # asked of clients, and given to the other sentinels
      lines += ["requirepass #{quote(@sentinel_password)}", "sentinel sentinel-pass #{quote(@sentinel_password)}"]
    end
    "#{lines.join("\n")}\n"
  end

  # A config-file string, whatever it holds.
  def quote(value)
    "\"#{value.gsub(/["\\]/) { |char| "\\#{char}" }}\""
  end

  # Every sentinel names the first node as master, lists the replica as healthy and knows the other sentinels.
  def sentinels_ready?
    sentinels.all? do |sentinel|
      master_port(sentinel) == @data_nodes.first.port && healthy_replica?(sentinel, @data_nodes.last) &&
        sentinel.admin.call("SENTINEL", "SENTINELS", name).size == SENTINELS - 1
    end
  end

  def master_port(sentinel)
    sentinel.admin.call("SENTINEL", "GET-MASTER-ADDR-BY-NAME", name)&.last.to_i
  end

  def healthy_replica?(sentinel, node)
    replica = replica_entry(sentinel, node)
    replica && replica["flags"] == "slave" && replica["master-link-status"] == "ok"
  end

  # What `sentinel` lists of `node` among the replicas (SENTINEL REPLICAS), nil if nothing.
  def replica_entry(sentinel, node)
    sentinel.admin.call("SENTINEL", "REPLICAS", name).map { |fields| Hash[*fields] }
            .find { |replica| replica["port"] == node.port.to_s }
  end
end

# Plain redis-rb clients of topology nodes, closed after each example tagged :topology.
module TopologyClients
  # A new client of `node`.
  def client_of(node)
    node.client.tap { |client| topology_clients << client }
  end

  # The example's one client of `node`.
  def node_client(node)
    (@node_clients ||= {})[node] ||= client_of(node)
  end

  def topology_clients
    @topology_clients ||= []
  end
end

if defined?(RSpec) # also loaded by benchmarks and child processes
  RSpec.configure do |config|
    config.include TopologyClients, :topology
    config.after(:each, :topology) { topology_clients.each(&:close) }
  end
end
