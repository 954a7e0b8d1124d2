# frozen_string_literal: true

# The gem on each Redis topology, in one run, all started here on free loopback ports: a
# standalone redis-server and a local Cluster of 3 masters without replicas (what routing costs);
# a Sentinel-managed primary (1 replica, 3 sentinels) reached through Sentinel and, as its
# baseline, by its address (what discovery costs: a primary with a replica does more work per write
# than one without); and the Cluster of the suite, 3 masters with 1 replica each.
#
#   bundle exec ruby bench/topologies.rb
#
#   uncontended  8 threads, each its own key (on a Cluster: spread over the 3 masters), lock +
#                empty block + unlock for SECONDS (default 2) per round, ROUNDS rounds (default
#                3) alternating between topologies: cycles/s and the client's CPU per cycle.
#                Target: a Cluster's client CPU per cycle at most 1.15x standalone's; Sentinel
#                the same as its primary reached directly, within noise.
#   handoff      4 threads x 25 blocking_lock turns at one key, each holding it 2 ms: the total
#                against the ideal 100 x 2 ms. Target on a Cluster: at most 1.3x.
#   publish      Cluster only, redis-rb with no gem: Redis's CPU (all 6 nodes) per message and the
#                delivery latency to a subscriber (one message in flight at a time), for PUBLISH
#                (what the gem uses: broadcast to every node) and SPUBLISH (Redis 7's sharded
#                channel: the shard's nodes only).

require "socket"
require_relative "support"
require_relative "../spec/support/topologies"

SECONDS = Float(ENV.fetch("SECONDS", "2"))
ROUNDS = Integer(ENV.fetch("ROUNDS", "3"))
THREADS = 8
CPU_TARGET = 1.15
HANDOFF_TARGET = 1.3
HOLD = 0.002
WORKERS = 4
TURNS = 25
MESSAGES = Integer(ENV.fetch("MESSAGES", "20000"))
LATENCY_ROUNDS = 500

def cpu
  Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID)
end

# One round of uncontended cycles: [cycles/s, client CPU µs per cycle].
def uncontended(lockers, keys)
  GC.start
  deadline = Bench.now + SECONDS
  cpu_before = cpu
  started = Bench.now
  counts = THREADS.times.map do |i|
    Thread.new { Bench.lock_cycles(lockers[i], keys[i], deadline: deadline) }
  end.map(&:value)
  wall = Bench.now - started
  cycles = counts.sum
  [cycles / wall, (cpu - cpu_before) / cycles * 1e6]
end

# 4 threads x 25 turns at one key: the total time against the ideal.
def handoff(lockers, key)
  started = Bench.now
  WORKERS.times.map do |i|
    Thread.new { TURNS.times { lockers[i].blocking_lock(key, timeout: 30) { sleep HOLD } } }
  end.each(&:join)
  (Bench.now - started) / (WORKERS * TURNS * HOLD)
end

def median(values)
  Bench.percentile(values, 0.5)
end

# Redis CPU over every node of the Cluster.
def cluster_cpu(cluster)
  cluster.live_nodes.sum { |node| Bench.redis_cpu(node.admin) }
end

# A RESP array of bulk strings from `io` (what a subscriber is sent).
def read_push(io)
  count = Integer(io.gets[1..])
  Array.new(count) do
    line = io.gets
    next Integer(line[1..]) if line.start_with?(":")

    io.read(Integer(line[1..]) + 2).chomp
  end
end

# A plain socket subscribed to `channel` on `node`.
def subscriber(node, verb, channel)
  socket = TCPSocket.new("127.0.0.1", node.port)
  socket.write("*2\r\n$#{verb.size}\r\n#{verb}\r\n$#{channel.bytesize}\r\n#{channel}\r\n")
  read_push(socket)
  socket
end

# [Redis CPU µs per message over all nodes, median and p99 delivery latency ms] of `verb` on
# `channel`.
# The listener is a plain socket (redis-rb 4.8 has no SSUBSCRIBE): on a node that is not the
# publisher's for PUBLISH (it reaches every node), on the shard's own for SPUBLISH.
def publications(cluster, verb, channel)
  owner = cluster.master_for_slot(KeySlots.slot(channel))
  listener_node = verb == "SPUBLISH" ? owner : (cluster.masters - [owner]).first
  listener = subscriber(listener_node, verb == "SPUBLISH" ? "SSUBSCRIBE" : "SUBSCRIBE", channel)
  publisher = owner.client
  # One message at a time, each read before the next is sent: the latency of one hand-off.
  latencies = Array.new(LATENCY_ROUNDS) do
    sent = Bench.now
    publisher.call(verb, channel, "x")
    read_push(listener)
    Bench.now - sent
  end
  reader = Thread.new { loop { break if read_push(listener).last == "stop" } }
  before = cluster_cpu(cluster)
  MESSAGES.times { publisher.call(verb, channel, "x") }
  spent = cluster_cpu(cluster) - before
  publisher.call(verb, channel, "stop")
  reader.join(10)
  [spent / MESSAGES * 1e6, median(latencies) * 1000, Bench.percentile(latencies, 0.99) * 1000]
ensure
  listener&.close
  publisher&.close
end

TopologyNode.own_session = true # every redis-server a service of its own, as the standalone one
standalone = RedisServer.new(own_session: true).start
cluster = RedisCluster.new(replicas: false).start
replicated = RedisCluster.new.start
sentinel = RedisSentinelSet.new.start
at_exit do
  [standalone, cluster, replicated, sentinel].each(&:shutdown)
end
Bench.header(standalone.url)
puts "topologies:   standalone, Cluster of 3 masters, Sentinel (primary + replica + 3 sentinels) and its " \
     "primary direct, Cluster of 3 masters + 3 replicas"
puts

prefix = "bench:"
topologies = {
  "standalone" => { redis_url: standalone.url },
  "cluster" => { cluster: cluster.seed_urls },
  "primary" => { redis_url: "redis://127.0.0.1:#{sentinel.primary.port}/0" },
  "sentinel" => { sentinels: sentinel.sentinel_urls, sentinel_master: "mymaster", redis_url: sentinel.master_url },
  "cluster+r" => { cluster: replicated.seed_urls }
}
spread = cluster.keys_on_each_master(3, base: "uncontended", prefix: prefix).values.flatten
keys = spread.first(THREADS).map { |key| key.delete_prefix(prefix) }
masters = keys.map { |key| cluster.master_for_slot(KeySlots.slot(prefix + key)) }.uniq.size
lockers = topologies.transform_values do |options|
  Array.new(THREADS) { LockManager::Locker.new(key_prefix: prefix, pool_size: 2, **options) }
end
lockers.each { |name, list| uncontended(list, keys) && puts("warmed up #{name}") }

results = Hash.new { |h, k| h[k] = [] }
ROUNDS.times do
  lockers.each { |name, list| results[name] << uncontended(list, keys) }
end
puts
puts "uncontended, #{THREADS} threads (keys on #{masters} Cluster masters), median of #{ROUNDS} rounds of #{SECONDS}s:"
base_rate = median(results["standalone"].map(&:first))
base_cpu = median(results["standalone"].map(&:last))
results.each do |name, rounds|
  rate = median(rounds.map(&:first))
  per_cycle = median(rounds.map(&:last))
  puts format("  %<name>-10s %<rate>8.0f cycles/s (%<rate_x>.2fx standalone)  client CPU %<cpu>5.1f µs/cycle " \
              "(%<cpu_x>.2fx standalone; rounds %<rounds>s)",
              name: name, rate: rate, rate_x: rate / base_rate, cpu: per_cycle, cpu_x: per_cycle / base_cpu,
              rounds: rounds.map { |r| r.last.round(1) }.join(", "))
end
ratio = median(results["cluster"].map(&:last)) / base_cpu
puts "  Cluster client CPU per cycle #{format("%.2fx", ratio)} standalone's (target <= #{CPU_TARGET}x): " \
     "#{Bench.verdict(ratio, CPU_TARGET)}"
through = median(results["sentinel"].map(&:first)) / median(results["primary"].map(&:first))
puts "  Sentinel #{format("%.2fx", through)} the cycles/s of its primary reached directly"

puts
puts "hand-off, #{WORKERS} threads x #{TURNS} turns holding #{(HOLD * 1000).round} ms " \
     "(total / ideal), median of #{ROUNDS}:"
handoffs = Hash.new { |h, k| h[k] = [] }
ROUNDS.times do
  lockers.each { |name, list| handoffs[name] << handoff(list, "handoff:#{name}") }
end
handoffs.each do |name, runs|
  puts format("  %<name>-10s %<total>.2fx ideal (runs %<runs>s)",
              name: name, total: median(runs), runs: runs.map { |r| r.round(2) }.join(", "))
end
puts "  Cluster #{format("%.2fx", median(handoffs["cluster"]))} (target <= #{HANDOFF_TARGET}x): " \
     "#{Bench.verdict(median(handoffs["cluster"]), HANDOFF_TARGET)}"

puts
puts "publish on the Cluster with replicas, #{MESSAGES} messages (redis-rb, no gem):"
%w[PUBLISH SPUBLISH].each do |verb|
  per_message, median, p99 = publications(replicated, verb, "bench-channel-#{verb.downcase}")
  puts format("  %<verb>-9s Redis CPU %<cpu>5.1f µs/message over all nodes, delivery median %<median>.2f ms, " \
              "p99 %<p99>.2f ms", verb: verb, cpu: per_message, median: median, p99: p99)
end
