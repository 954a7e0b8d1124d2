# frozen_string_literal: true

require "spec_helper"
require "logger"
require "stringio"
require_relative "../support/topologies"

# What the threads cycling locks in an example saw, shared between them.
class ClusterTally
  attr_reader :errors, :durations, :tokens, :most_holders, :acquired_at

  def initialize
    @mutex = Mutex.new
    @errors = []
    @durations = [] # [started, finished] of every call
    @tokens = Hash.new { |hash, key| hash[key] = [] } # per key, in the order the blocks entered
    @holders = Hash.new(0)
    @most_holders = Hash.new(0)
    @acquired_at = []
  end

  def enter(key, fencing_token, at)
    @mutex.synchronize do
      @holders[key] += 1
      @most_holders[key] = [@most_holders[key], @holders[key]].max
      @tokens[key] << fencing_token
      @acquired_at << at
    end
  end

  def leave(key)
    @mutex.synchronize { @holders[key] -= 1 }
  end

  def call(started, finished, error = nil)
    @mutex.synchronize do
      @durations << [started, finished]
      @errors << error if error
    end
  end

  def acquisitions_between(from, to)
    @mutex.synchronize { @acquired_at.count { |at| at.between?(from, to) } }
  end

  def calls_spanning(from, to)
    @mutex.synchronize { @durations.count { |started, finished| started < to && finished > from } }
  end
end

# A Redis Cluster changing under the locks: a slot migrated while its keys' locks cycle, and a
# master SIGKILLed while waiters wait for its keys' locks and other masters' keys keep cycling.
# Each example starts a cluster of its own (RedisCluster.new.start, shut down after it). Bounds
# are generous: the suite runs on a busy 2-core machine, next to other topologies. Set
# LM_TOPOLOGY_TIMES to see what was measured.
RSpec.describe "A Redis Cluster changing under the locks", :topology do
  let(:cluster) { own_server(RedisCluster) }
  let(:log) { StringIO.new }

  before do
    io = log
    LockManager.configure { |c| c.logger = Logger.new(io) }
  end

  def cluster_locker(seeds: cluster.seed_urls, **options)
    LockManager::Locker.new(cluster: seeds, key_prefix: prefix, **options)
  end

  def master_of(key)
    cluster.master_for_slot(KeySlots.slot(prefix + key))
  end

  def measured(**values)
    warn "  #{RSpec.current_example.description[0, 60]}: #{values}" if ENV["LM_TOPOLOGY_TIMES"]
  end

  # A thread that cycles `blocking_lock` on `key` through `locker` until `running` is false,
  # counting holders and recording fencing tokens in `tally`.
  def cycler(locker, key, tally, running)
    Thread.new do
      while running.call
        started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
        begin
          locker.blocking_lock(key, timeout: 10) do |lock|
            tally.enter(key, lock.fencing_token, Process.clock_gettime(Process::CLOCK_MONOTONIC))
            sleep 0.005
            tally.leave(key)
          end
          tally.call(started, Process.clock_gettime(Process::CLOCK_MONOTONIC))
        rescue StandardError => e
          tally.call(started, Process.clock_gettime(Process::CLOCK_MONOTONIC), e)
        end
      end
    end
  end

  it "migrates a slot there and back while 8 threads cycle locks on its keys: no error, never 2 holders of a key, " \
     "fencing tokens only grow, releases never fail", timeout: 90 do
    source = cluster.masters.first
    slot = cluster.slot_ranges_of(source).first.first + rand(1000)
    target = cluster.masters.last
    keys = cluster.keys_in_slot(slot, 4, base: "migrating")
    expect(keys.map { |key| KeySlots.slot(prefix + key) }.uniq).to eq([slot])
    bystanders = (cluster.masters - [source]).map do |master|
      cluster.key_in_slot_of(master, "bystander", prefix: prefix)
    end
    expect(([keys.first] + bystanders).map { |key| master_of(key) }.uniq.size).to eq(3)

    lockers = Array.new(2) { cluster_locker(read_timeout: 3) } # asks a migrating slot again for up to 3 s
    tally = ClusterTally.new
    running = true
    threads = Array.new(8) { |i| cycler(lockers[i % 2], keys[i % 4], tally, -> { running }) }
    threads += bystanders.map { |key| cycler(lockers.first, key, tally, -> { running }) }
    windows = []
    migrate = lambda do |to|
      began = monotonic
      cluster.begin_migration(slot, to: to)
      sleep 0.2 # locks cycle while the slot is MIGRATING on one side, IMPORTING on the other
      moved = cluster.migrate_keys(slot)
      sleep 0.2 # ... and while its keys are on the target already
      cluster.finish_migration(slot)
      windows << [began, monotonic, moved]
      sleep 0.5 # ... and after
    end

    begin
      sleep 0.5
      before = tally.acquisitions_between(0, monotonic)
      migrate.call(target)
      expect(cluster.master_for_slot(slot)).to eq(target)
      migrate.call(source)
      expect(cluster.master_for_slot(slot)).to eq(source)
    ensure
      running = false
      threads.each(&:join)
    end

    spans = windows.map { |began, ended, _| tally.calls_spanning(began, ended) }
    during = windows.map { |began, ended, _| tally.acquisitions_between(began, ended) }
    after = windows.map { |_, ended, _| tally.acquisitions_between(ended, ended + 0.5) }
    longest = tally.durations.map { |started, finished| finished - started }.max
    measured(windows: windows.map { |began, ended, moved| [(ended - began).round(3), moved] }, before: before,
             during: during, after: after, spans: spans, longest: longest.round(3), calls: tally.durations.size)

    expect(tally.errors).to eq([])
    expect(tally.most_holders.values_at(*keys)).to eq([1] * 4)
    keys.each do |key|
      tokens = tally.tokens[key]
      expect(tokens.size).to be >= 10
      expect(tokens).to all(be_an(Integer))
      expect(tokens).to eq(tokens.sort.uniq), "fencing tokens of #{key} went back: #{tokens.inspect}"
    end
    expect(windows.map(&:last)).to all(be_positive) # the locks' keys (the fencing counter at least) moved
    expect(spans).to all(be >= 8) # every thread had a call under way during each migration
    expect(before).to be_positive
    expect(after).to all(be_positive) # cycling again once the slot moved
    expect(longest).to be < 5
    expect(held_keys(node_client(source), "#{prefix}*")).to eq([])
    expect(node_client(target).call("CLUSTER", "COUNTKEYSINSLOT", slot)).to eq(0)
    # A release refused meanwhile would leave its lock to expire (or, worse, half done): none was.
    expect(log.string).to eq("")
  end

  it "hands a lock released while its slot is MIGRATING to the waiter queued for it: the release says it did",
     timeout: 60 do
    source = cluster.masters.first
    slot = cluster.slot_ranges_of(source).first.first + rand(1000)
    key = cluster.keys_in_slot(slot, 1, base: "handed").first
    holder = cluster_locker(read_timeout: 3).try_lock(key, timeout: 30)
    waiter = Thread.new { cluster_locker.lock(key, timeout: 20) }
    eventually(timeout: 10) { node_client(source).zcard(KeySlots.queue_key(prefix + key)) == 1 }

    cluster.begin_migration(slot, to: cluster.masters.last) # no key moved yet: all of the lock's are on the source
    released = Thread.new do
      holder.release
    rescue LockManager::Error => e
      e
    end
    sleep 0.2 # released while MIGRATING (a release that asks again meanwhile has 2.8 s of read_timeout left)
    cluster.migrate_keys(slot)
    sleep 0.2
    cluster.finish_migration(slot)
    handed = waiter.value

    expect(released.value).to be(true)
    expect(handed.owned?).to be(true)
    expect(handed.fencing_token).to be > holder.fencing_token
    expect(handed.release).to be(true)
    expect(log.string).to eq("")
  end

  it "gives waiters on a SIGKILLed master's keys their locks once its replica took over, while other masters' keys " \
     "keep cycling fast", timeout: 90 do
    victim = cluster.masters[1]
    replica = cluster.replica_of(victim)
    others = cluster.masters - [victim]
    victim_keys = Array.new(3) { |n| cluster.key_in_slot_of(victim, "victim#{n}", prefix: prefix) }
    other_keys = others.flat_map do |master|
      Array.new(2) { |n| cluster.key_in_slot_of(master, "other#{n}", prefix: prefix) }
    end
    expect(victim_keys.map { |key| master_of(key) }.uniq).to eq([victim])
    expect((victim_keys + other_keys).map { |key| master_of(key) }.uniq.size).to eq(3)
    # The victim first among the seeds: the one subscriber connection of `app` is likely on it.
    seeds = ["redis://127.0.0.1:#{victim.port}"] + others.map { |master| "redis://127.0.0.1:#{master.port}" }
    app = cluster_locker(seeds: seeds)
    holders = victim_keys.map { |key| cluster_locker.try_lock(key, timeout: 30) }

    waiters = victim_keys.map do |key|
      Thread.new do
        app.blocking_lock(key, timeout: 10) { |lock| [monotonic, lock.fencing_token] }
      rescue StandardError => e
        e
      end
    end
    eventually(timeout: 10) do
      victim_keys.all? { |key| node_client(victim).zcard(KeySlots.queue_key(prefix + key)) == 1 }
    end
    expect(node_client(victim).wait(1, 2000)).to eq(1) # the replica has the locks and the queues

    running = true
    calls = Queue.new
    # Ruby's collector stays out of the latencies (the suite's heap is large, and a full collection on a
    # loaded 2-core machine can outlast 0.5 s): they are the router's.
    GC.start
    GC.disable
    cycling = Thread.new do
      n = 0
      while running
        key = other_keys[n % other_keys.size]
        started = monotonic
        outcome = begin
          n.even? ? app.nonblocking_lock(key, timeout: 5) { :ran }.result : app.blocking_lock(key, timeout: 5) { :ran }
        rescue StandardError => e
          e
        end
        calls << [started, monotonic, outcome]
        n += 1
        sleep 0.01
      end
    end

    begin
      sleep 0.3
      killed_at = monotonic
      cluster.kill_master(victim)
      expect(cluster.wait_for_failover(victim, timeout: 20)).to eq(replica)
      failed_over_at = monotonic
      released = holders.map(&:release)
      released_at = monotonic
      got = waiters.map(&:value)
      sleep 0.3
    ensure
      running = false
      cycling.join
      GC.enable
    end

    cycles = Array.new(calls.size) { calls.pop }
    latencies = cycles.to_h { |started, finished, _| [started, finished - started] } # by when each started
    during_failover = cycles.count { |started, _, _| started.between?(killed_at, failed_over_at) }
    waiters_in = got.map { |entered, _| entered.is_a?(Float) ? (entered - released_at).round(3) : entered }
    measured(failover: (failed_over_at - killed_at).round(3), waiters_in_after_release: waiters_in,
             cycles: cycles.size, during_failover: during_failover, slowest_cycle: latencies.values.max.round(3))

    expect(released).to eq([true] * 3) # the locks lived on in the replica
    got.each_with_index do |outcome, n|
      expect(outcome).to be_an(Array), "waiter of #{victim_keys[n]}: #{outcome.inspect}"
      entered, fencing_token = outcome
      expect(entered).to be > failed_over_at
      expect(entered - released_at).to be < 3
      expect(fencing_token).to be > holders[n].fencing_token
    end
    expect(cycles.map(&:last).reject { |outcome| outcome == :ran }).to eq([])
    expect(during_failover).to be >= 10
    slowest = latencies.max_by(3, &:last).map { |started, seconds| [(started - killed_at).round(3), seconds.round(3)] }
    expect(latencies.values.max).to(be < 0.5, "the slowest cycles ([start after the kill, seconds]): #{slowest}, " \
                                              "failed over #{(failed_over_at - killed_at).round(3)} s after the kill")
    victim_keys.each { |key| expect(app.locked?(key)).to be(false) }
    expect(cluster.masters).to include(replica)
    expect(held_keys(node_client(replica), "#{prefix}*")).to eq([])
  end

  it "with min_replicas: 1, grants a lock its master's replica acknowledged, and refuses it, leaving no lock, while " \
     "that replica is stopped; other masters' keys are granted meanwhile", timeout: 40 do
    locker = cluster_locker(min_replicas: 1)
    keys = cluster.keys_on_each_master(1, base: "acked", prefix: prefix).values.flatten.map do |k|
      k.delete_prefix(prefix)
    end
    victim_key, *other_keys = keys
    master = master_of(victim_key)
    replica = cluster.replica_of(master)
    waits_before = node_client(master).info("commandstats").dig("wait", "calls").to_i
    replica_client = client_of(replica).tap { |client| client.call("READONLY") } # a Cluster replica's reads
    on_replica = locker.nonblocking_lock(victim_key) { replica_client.get(prefix + victim_key) }
    expect(on_replica.result).to match(SpecHelpers::TOKEN) # the replica had the token before the block ran
    waits = node_client(master).info("commandstats").dig("wait", "calls").to_i
    expect(waits).to be > waits_before

    cluster.pause(replica)
    begin
      started = monotonic
      error = begin
        locker.nonblocking_lock(victim_key) { :ran }
      rescue LockManager::Error => e
        e
      end
      took = monotonic - started
      others = other_keys.map { |key| locker.nonblocking_lock(key) { :ran }.result }
    ensure
      cluster.resume(replica)
    end
    expect(error).to be_a(LockManager::NotReplicated)
    expect(error.message).to include(victim_key.inspect, "0 of the 1")
    expect(took).to be < 1.0
    expect(node_client(master).exists?(prefix + victim_key)).to be(false)
    expect(others).to eq(%i[ran ran])
  end
end
