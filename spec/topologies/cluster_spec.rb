# frozen_string_literal: true

require "spec_helper"
require "json"
require_relative "../support/topologies"
require_relative "../support/process_helpers"
require_relative "../support/cross_process"

# The seed's stories on a Redis Cluster (RedisCluster.shared: 3 masters, 1 replica each), with
# Lockers given the masters as `cluster:` seeds and keys on all 3 masters: each story is checked
# for a key of each master, so every node's routing is exercised. What the gem wrote is looked at
# on the master that serves the key's slot, with a plain client of that node.
RSpec.describe "Locks on a Redis Cluster", :topology do
  include ProcessHelpers

  let(:cluster) { RedisCluster.shared }

  def token_pattern
    SpecHelpers::TOKEN
  end

  after { stop_all }

  def cluster_locker(**options)
    LockManager::Locker.new(cluster: cluster.seed_urls, key_prefix: prefix, **options)
  end

  # `count` keys on each master, as {master => keys}; checks they lie on 3 distinct masters.
  def spread_keys(count = 1, base: "key")
    by_master = cluster.keys_on_each_master(count, base: base, prefix: prefix)
    by_master.each do |master, keys|
      expect(keys.size).to eq(count)
      keys.each { |key| expect(master_of(key)).to eq(master) }
    end
    expect(by_master.keys.uniq.size).to eq(3)
    by_master.each_key { |master| node_client(master) } # made here, not by threads at once
    by_master
  end

  def master_of(key)
    cluster.master_for_slot(KeySlots.slot(prefix + key))
  end

  # One key on each master, as {master => key}.
  def key_on_each_master(base: "key")
    spread_keys(1, base: base).transform_values(&:first)
  end

  # Runs the block in `count` threads released at the same instant; their values, in order.
  def together(count)
    ready = Queue.new
    go = Queue.new
    threads = Array.new(count) do |i|
      Thread.new do
        ready << i
        go.pop
        yield i
      end
    end
    count.times { ready.pop }
    count.times { go << true }
    threads.map(&:value)
  end

  # Sleeps until the block is truthy or `timeout` seconds have passed (never raises: the caller
  # asserts what came of it).
  def wait_for(timeout)
    deadline = monotonic + timeout
    sleep 0.005 until yield || monotonic > deadline
  end

  # `intervals`: [[entered, left], ...] of one key, in any order; true when no two overlap.
  def one_at_a_time?(intervals)
    intervals.sort.each_cons(2).all? { |(_, left), (entered, _)| entered >= left }
  end

  # The most intervals open at once.
  def most_at_once(intervals)
    events = intervals.flat_map { |entered, left| [[entered, 1], [left, -1]] }.sort_by { |at, step| [at, step] }
    events.reduce([0, 0]) { |(now, most), (_, step)| [now + step, [most, now + step].max] }.last
  end

  # Keys of this example left on `master`: locks, queues, waiters (not the fencing counters).
  def leftovers(master)
    held_keys(node_client(master), "#{prefix}*")
  end

  it "lets exactly 1 of 5 simultaneous nonblocking callers (each its own Locker) run, for a key on each master",
     timeout: 30 do
    keys = key_on_each_master
    callers = keys.keys.product(Array(0...5)) # [master, n]: 5 callers per key
    lockers = Array.new(callers.size) { cluster_locker }
    skipped = keys.transform_values { Queue.new }

    results = together(callers.size) do |i|
      master, = callers[i]
      key = keys.fetch(master)
      result = lockers[i].nonblocking_lock(key, timeout: 10) do
        # Held until the other 4 callers have tried (bounded: a second holder would wait too).
        wait_for(5) { skipped[master].size >= 4 }
        node_client(master).get(prefix + key)
      end
      skipped[master] << i unless result.run?
      [master, result]
    end

    results.group_by(&:first).each do |master, outcomes|
      ran, skips = outcomes.map(&:last).partition(&:run?)
      expect(ran.size).to eq(1), "#{ran.size} of 5 ran for the key on #{master.inspect}"
      expect(skips.size).to eq(4)
      expect(skips.map(&:result)).to all(be_nil)
      expect(ran.first.result).to match(token_pattern) # the lock was on the master of its slot
      expect(leftovers(master)).to eq([])
    end
    expect(results.map(&:first).uniq.size).to eq(3)
  end

  it "runs 3 blocking callers of a key one after another, none overlapping, for a key on each master", timeout: 40 do
    keys = key_on_each_master
    lockers = Array.new(9) { cluster_locker }

    runs = together(9) do |i|
      key = keys.values[i % 3]
      lockers[i].blocking_lock(key, timeout: 15) do
        entered = monotonic
        sleep 0.2
        [key, entered, monotonic]
      end
    end

    by_key = runs.group_by(&:first).transform_values { |rows| rows.map { |_, entered, left| [entered, left] } }
    expect(by_key.keys).to match_array(keys.values)
    by_key.each do |key, intervals|
      expect(intervals.size).to eq(3)
      expect(one_at_a_time?(intervals)).to be(true), "#{key}: #{intervals.sort.inspect}"
      expect(intervals.flatten.max - intervals.flatten.min).to be >= 0.6
    end
    keys.each_key { |master| expect(leftovers(master)).to eq([]) }
  end

  it "holds locks on different keys (per-ID, spread over the masters) at the same time, through the shared " \
     "Locker of LockManager.configure", timeout: 30 do
    keys = spread_keys(2, base: "user").values.flatten
    seeds = cluster.seed_urls
    LockManager.configure do |c|
      c.cluster = seeds
      c.key_prefix = prefix
      c.pool_size = 8
    end
    expect(LockManager::Locker.instance.settings[:cluster]).to eq(seeds)
    inside = Queue.new
    release = Queue.new
    checker = cluster_locker

    threads = keys.map do |key|
      Thread.new { LockManager::Locker.nonblocking_lock(key, timeout: 10) { (inside << key) && release.pop } }
    end
    begin
      eventually(timeout: 10) { inside.size == keys.size }
      held_at_once = keys.map { |key| checker.locked?(key) }
      on_masters = keys.map { |key| node_client(master_of(key)).exists?(prefix + key) }
    ensure
      keys.size.times { release << :done }
    end
    results = threads.map(&:value)

    expect(held_at_once).to all(be(true))
    expect(on_masters).to all(be(true))
    expect(results.map(&:run?)).to all(be(true))
    expect(results.map(&:result)).to all(eq(:done))
    expect(keys.map { |key| checker.locked?(key) }).to all(be(false))
  end

  describe "limit: 2" do
    it "lets 2 of 3 simultaneous nonblocking callers run, holding at once, for a key on each master", timeout: 30 do
      keys = key_on_each_master(base: "pool")
      callers = keys.keys.product(Array(0...3))
      lockers = Array.new(callers.size) { cluster_locker }
      inside = keys.transform_values { Queue.new }
      skipped = keys.transform_values { Queue.new }

      results = together(callers.size) do |i|
        master, = callers[i]
        result = lockers[i].nonblocking_lock(keys.fetch(master), limit: 2, timeout: 10) do |lock|
          inside[master] << lock.fencing_token
          # Both holders stay in until the third caller has tried, and both are seen inside.
          wait_for(5) { skipped[master].size >= 1 && inside[master].size >= 2 }
          inside[master].size
        end
        skipped[master] << i unless result.run?
        [master, result]
      end

      results.group_by(&:first).each do |master, outcomes|
        ran, skips = outcomes.map(&:last).partition(&:run?)
        expect(ran.size).to eq(2), "#{ran.size} of 3 ran for the key on #{master.inspect}"
        expect(skips.size).to eq(1)
        expect(ran.map(&:result)).to eq([2, 2]) # each saw both holders inside
        expect(ran.map(&:fencing_token).uniq.size).to eq(2)
        expect(leftovers(master)).to eq([])
      end
    end

    it "never lets more than 2 of 4 blocking threads in at once, and every one runs, for a key on each master",
       timeout: 40 do
      keys = key_on_each_master(base: "pool")
      lockers = Array.new(12) { cluster_locker }

      runs = together(12) do |i|
        key = keys.values[i % 3]
        Array.new(2) do
          lockers[i].blocking_lock(key, limit: 2, timeout: 15) do
            entered = monotonic
            sleep 0.1
            [key, entered, monotonic]
          end
        end
      end.flatten(1)

      by_key = runs.group_by(&:first).transform_values { |rows| rows.map { |_, entered, left| [entered, left] } }
      expect(by_key.keys).to match_array(keys.values)
      by_key.each do |key, intervals|
        expect(intervals.size).to eq(8)
        expect(most_at_once(intervals)).to eq(2), "#{key}: #{intervals.sort.inspect}"
      end
      keys.each_key { |master| expect(leftovers(master)).to eq([]) }
    end
  end

  it "gives the lock to fair waiters in the order they queued, for a key on each master", timeout: 40 do
    keys = key_on_each_master(base: "fair")
    holders = keys.transform_values { |key| cluster_locker.try_lock(key, timeout: 30) }
    order = keys.transform_values { Queue.new }
    waiters = keys.flat_map do |master, key|
      queue = KeySlots.queue_key(prefix + key)
      Array.new(4) do |n|
        locker = cluster_locker
        thread = Thread.new { locker.blocking_lock(key, timeout: 20, fair: true) { order[master] << n } }
        eventually(timeout: 10) { node_client(master).zcard(queue) == n + 1 } # queued after the previous one
        thread
      end
    end

    holders.each_value { |holder| expect(holder.release).to be(true) }
    waiters.each(&:join)

    order.each do |master, served|
      expect(Array.new(served.size) { served.pop }).to eq([0, 1, 2, 3]), "order on #{master.inspect}"
      expect(leftovers(master)).to eq([])
    end
  end

  it "keeps a lock with renew: true while its block outlives the timeout, and keeps the block's result, " \
     "for a key on each master", timeout: 30 do
    keys = key_on_each_master(base: "renewed")
    other = cluster_locker

    outcomes = keys.map do |master, key|
      locker = cluster_locker
      Thread.new do
        taken_meanwhile = []
        ttls = []
        result = locker.nonblocking_lock(key, timeout: 1.5, renew: true) do |lock|
          started = monotonic
          while monotonic - started < 3.5 # more than 2 timeouts
            taken_meanwhile << other.try_lock(key, timeout: 10)
            ttls << node_client(master).pttl(prefix + key)
            sleep 0.1
          end
          [key, lock.lost?]
        end
        [master, key, result, taken_meanwhile.compact, ttls]
      end
    end.map(&:value)

    outcomes.each do |master, key, result, taken, ttls|
      taken.each(&:release)
      expect(result.run?).to be(true)
      expect(result.result).to eq([key, false])
      expect(result.lost?).to be(false)
      expect(taken).to eq([]), "another caller took #{key} on #{master.inspect} while renewed"
      expect(ttls.size).to be >= 10
      expect(ttls).to all(be_between(1, 1500))
      expect(other.nonblocking_lock(key) { :free_again }.result).to eq(:free_again)
      expect(leftovers(master)).to eq([])
    end
  end

  it "runs the blocks of 3 processes (ruby -e, cluster: seeds) one at a time per key, with growing fencing " \
     "tokens, for a key on each master", timeout: 60 do
    keys = key_on_each_master(base: "proc").values
    script = <<~RUBY
      $stdout.sync = true
      require "json"
      require "lock_manager"
      locker = LockManager::Locker.new(cluster: ENV.fetch("LM_SEEDS").split(","), key_prefix: ENV.fetch("LM_PREFIX"))
      clock = -> { Process.clock_gettime(Process::CLOCK_MONOTONIC) }
      puts "ready"
      $stdin.gets
      runs = ENV.fetch("LM_KEYS").split(",").map do |key|
        Thread.new do
          Array.new(3) do
            locker.blocking_lock(key, timeout: 30) do |lock|
              entered = clock.call
              sleep 0.05
              [key, entered, clock.call, lock.fencing_token]
            end
          end
        end
      end.flat_map(&:value)
      puts JSON.generate(runs)
    RUBY
    env = { "LM_SEEDS" => cluster.seed_urls.join(","), "LM_PREFIX" => prefix, "LM_KEYS" => keys.join(",") }
    children = Array.new(3) { ruby_child(script, env) }
    expect(children.map { |child| child.gets(timeout: 20) }).to eq(["ready"] * 3)
    children.each { |child| child.puts("go") }

    runs = children.flat_map { |child| JSON.parse(child.gets(timeout: 40)) }
    children.each { |child| expect(child.wait(timeout: 10)&.exitstatus).to eq(0) }

    by_key = runs.group_by(&:first)
    expect(by_key.keys).to match_array(keys)
    by_key.each do |key, rows|
      expect(rows.size).to eq(9)
      intervals = rows.map { |_, entered, left, _| [entered, left] }
      expect(one_at_a_time?(intervals)).to be(true), "#{key}: #{intervals.sort.inspect}"
      tokens = rows.sort_by { |_, entered, _, _| entered }.map(&:last)
      expect(tokens).to all(be_an(Integer))
      expect(tokens).to eq(tokens.sort.uniq)
    end
    cluster.masters.each { |master| expect(leftovers(master)).to eq([]) }
  end

  # limit:, fair: and renew: with the holders in processes of their own (see CrossProcess), each
  # process locking a key on each master, one thread per key.
  describe "across processes (ruby -e children, cluster: seeds)" do
    include CrossProcess

    def topology_env
      { "LM_SEEDS" => cluster.seed_urls.join(",") }
    end

    # Waiters queued for `key`, on the master serving its slot.
    def queued(key)
      node_client(master_of(key)).zcard(KeySlots.queue_key(prefix + key))
    end

    it "limit: 2 lets at most 2 of 4 processes in at once (and 2 do get in), over all their cycles, with growing " \
       "fencing tokens, for a key on each master", timeout: 30 do
      keys = key_on_each_master(base: "pool").values
      children = lock_processes(4, "cycles", keys, cycles: 3, limit: 2, hold: 0.15, timeout: 10)
      children.each { |child| child.puts("go") }
      runs, statuses = finished_runs(children)

      expect(statuses).to eq([0] * 4)
      by_key = runs.group_by { |run| run.fetch("key") }
      expect(by_key.keys).to match_array(keys)
      by_key.each do |key, key_runs|
        expect(key_runs.map { |run| run.fetch("child") }.tally).to eq({ 0 => 3, 1 => 3, 2 => 3, 3 => 3 })
        expect(peak_inside(key_runs)).to eq(2), "#{key}: #{key_runs.map { |run| run.values_at("entered", "left") }}"
        tokens = key_runs.map { |run| run.fetch("token") }
        expect(tokens).to all(be_an(Integer))
        expect(tokens.uniq.size).to eq(12)
        expect(token_order_violations(key_runs)).to eq([]), key
      end
      cluster.masters.each { |master| expect(leftovers(master)).to eq([]) }
    end

    it "fair: true gives the lock to 3 processes in the order they queued behind a holding process, for a key on " \
       "each master", timeout: 30 do
      keys = key_on_each_master(base: "fair").values
      holder = lock_process("hold", keys, timeout: 10)
      waiters = lock_processes(3, "cycles", keys, fair: true, hold: 0.05, timeout: 10)
      holder.puts("go")
      expect(reports_until(holder, "holding")).to eq([])
      waiters.each_with_index do |waiter, n|
        waiter.puts("go")
        eventually(timeout: 5) { keys.all? { |key| queued(key) == n + 1 } } # on every master, behind the previous one
      end

      holder.puts("release")
      held = reports_until(holder, "done")
      runs, statuses = finished_runs(waiters)

      expect(holder.wait&.exitstatus).to eq(0)
      expect(statuses).to eq([0, 0, 0])
      expect(held.map { |report| report.values_at("key", "run", "lost") })
        .to match_array(keys.map { |key| [key, true, false] })
      by_key = runs.group_by { |run| run.fetch("key") }
      expect(by_key.keys).to match_array(keys)
      by_key.each do |key, key_runs|
        order = entry_order(key_runs)
        expect(order.map(&:first)).to eq([0, 1, 2]), "#{key}: #{order.inspect}"
        holder_token = held.find { |report| report.fetch("key") == key }.fetch("token")
        expect([holder_token] + order.map(&:last)).to eq(([holder_token] + order.map(&:last)).sort.uniq)
        expect(peak_inside(key_runs)).to eq(1)
      end
      cluster.masters.each { |master| expect(leftovers(master)).to eq([]) }
    end

    it "renew: true keeps a process's locks (timeout: 1) for 3 s, while this process is refused them, and " \
       "frees them after, for a key on each master", timeout: 30 do
      by_master = key_on_each_master(base: "renewed")
      keys = by_master.values
      child = lock_process("hold", keys, timeout: 1, renew: true)
      other = cluster_locker
      child.puts("go")
      expect(reports_until(child, "holding")).to eq([])

      attempts = []
      started = monotonic
      while monotonic - started < 3
        by_master.each do |master, key|
          attempts << [key, other.nonblocking_lock(key) { :taken }.run?, node_client(master).pttl(prefix + key)]
        end
        sleep 0.1
      end
      child.puts("release")
      held = reports_until(child, "done")

      expect(child.wait&.exitstatus).to eq(0)
      expect(held.map { |report| report.values_at("key", "run", "lost_inside", "lost") })
        .to match_array(keys.map { |key| [key, true, false, false] })
      expect(held.map { |report| report.fetch("held_for") }).to all(be >= 3)
      attempts.group_by(&:first).each do |key, tries|
        expect(tries.size).to be >= 10
        expect(tries.map { |_, ran, _| ran }).to all(be(false)), "#{key} was taken while renewed"
        expect(tries.map(&:last)).to all(be_between(1, 1000)) # renewed: it outlived its 1 s
      end
      keys.each { |key| expect(other.nonblocking_lock(key) { :free }.result).to eq(:free) }
      by_master.each_key { |master| expect(leftovers(master)).to eq([]) }
    end
  end

  it "takes, checks, hands over and releases lock handles, for a key on each master", timeout: 30 do
    keys = key_on_each_master(base: "handle")
    locker = cluster_locker
    other = cluster_locker

    keys.each do |master, key|
      lock = locker.try_lock(key, timeout: 10)
      expect(lock).to be_a(LockManager::Lock)
      expect(lock.owned?).to be(true)
      expect(node_client(master).get(prefix + key)).to eq(lock.token)
      expect(node_client(master).pttl(prefix + key)).to be_between(9_000, 10_000)
      expect(other.try_lock(key)).to be_nil
      expect(other.locked?(key)).to be(true)
      expect { other.lock(key, timeout: 0.3) }.to raise_error(LockManager::LockNotAcquired)

      waiter = Thread.new { other.lock(key, timeout: 10) }
      eventually { node_client(master).zcard(KeySlots.queue_key(prefix + key)) == 1 }
      expect(lock.release).to be(true)
      handed = waiter.value

      expect(handed.owned?).to be(true)
      expect(node_client(master).get(prefix + key)).to eq(handed.token)
      expect(handed.fencing_token).to be > lock.fencing_token
      expect(lock.owned?).to be(false)
      expect(lock.release).to be(false)
      expect(handed.release).to be(true)
      expect(locker.locked?(key)).to be(false)
      expect(leftovers(master)).to eq([])
    end
  end

  it "issues growing fencing tokens for a key, through every API and Locker, from its slot's counter on its master",
     timeout: 30 do
    keys = key_on_each_master(base: "fenced")
    lockers = Array.new(3) { cluster_locker }
    calls = [
      ->(l, key) { l.nonblocking_lock(key) {}.fencing_token },
      ->(l, key) { l.blocking_lock(key, timeout: 5, &:fencing_token) },
      ->(l, key) { l.try_lock(key, timeout: 0.05).fencing_token }, # left to expire
      ->(l, key) { l.lock(key, timeout: 5).tap(&:release).fencing_token },
      ->(l, key) { l.nonblocking_lock(key, limit: 2, &:fencing_token).result }
    ]

    # Each Locker's try_lock handle is left to expire (not released), as a crashed job's would be,
    # and the same thread locks the key again through that Locker afterwards.
    keys.each do |master, key|
      tokens = Array.new(15) do |n|
        sleep 0.06 if n % calls.size == 3 # the try_lock before has expired
        calls[n % calls.size].call(lockers[n % lockers.size], key)
      end

      expect(tokens).to all(be_an(Integer))
      expect(tokens).to eq(tokens.sort.uniq), "tokens of #{key}: #{tokens.inspect}"
      counter = node_client(master).get(KeySlots.fencing_counter_key(prefix + key))
      expect(Integer(counter)).to be >= tokens.last
    end
  end

  it "raises ClusterError, at once and writing nothing, for a key of another master when given one node as " \
     "redis_url (no cluster:)", timeout: 30 do
    keys = key_on_each_master(base: "single")
    node = keys.keys.first
    single = LockManager::Locker.new(redis_url: "redis://127.0.0.1:#{node.port}", key_prefix: prefix)

    expect(single.nonblocking_lock(keys.fetch(node)) { :served }.result).to eq(:served)
    (keys.keys - [node]).each do |master|
      key = keys.fetch(master)
      moved = /MOVED #{KeySlots.slot(prefix + key)} 127\.0\.0\.1:#{master.port}/
      expect { single.nonblocking_lock(key) { raise "must not run" } }.to raise_error(LockManager::ClusterError, moved)
      expect { single.try_lock(key) }.to raise_error(LockManager::ClusterError, moved)
      took = elapsed do
        expect { single.blocking_lock(key, timeout: 5) { raise "must not run" } }
          .to raise_error(LockManager::ClusterError, moved)
      end
      expect(took).to be < 1 # not ridden out until the deadline: asking again cannot help
      expect { single.locked?(key) }.to raise_error(LockManager::ClusterError)
    end
    keys.each_key { |master| expect(leftovers(master)).to eq([]) }
  end

  it "opens connections to the nodes it uses only, and none more over many cycles", timeout: 60 do
    keys = spread_keys(2, base: "pooled")
    masters = keys.keys
    locker = cluster_locker(pool_size: 3)
    expect(locker.pool_state).to eq([0, 0])
    masters.each_with_index do |master, n|
      locker.nonblocking_lock(keys[master].first) {}
      expect(locker.pool_state).to eq([n + 1, n + 1]) # one connection more: to this master
    end

    all_keys = keys.values.flatten
    cycles = lambda do
      Array.new(6) do |i|
        Thread.new do
          40.times do |n|
            key = all_keys[(i + n) % all_keys.size]
            n.even? ? locker.blocking_lock(key, timeout: 10) {} : locker.nonblocking_lock(key) {}
          end
        end
      end.each(&:join)
    end
    cycles.call # warm: pools filled as far as the threads need, the subscriber connected
    held = locker.try_lock(all_keys.first)
    waiter = Thread.new { locker.blocking_lock(all_keys.first, timeout: 10) { :waited } }
    sleep 0.2
    held.release
    expect(waiter.value).to eq(:waited)
    warm_open, warm_idle = locker.pool_state
    clients = masters.map { |master| client_addresses(node_client(master)) }
    received = masters.map { |master| total_connections(node_client(master)) }

    5.times { cycles.call }

    open, idle = locker.pool_state
    expect(warm_idle).to eq(warm_open)
    expect(open).to be_between(warm_open, 9) # 3 nodes, pool_size 3 each
    expect(idle).to eq(open)
    # Every connection the masters accepted since is one the pools still hold (they may have grown
    # to their size): none was dropped, reopened or left behind. (Other examples' Lockers may have
    # closed theirs meanwhile.)
    accepted = masters.each_with_index.sum { |master, n| total_connections(node_client(master)) - received[n] }
    expect(accepted).to eq(open - warm_open)
    new_clients = masters.each_with_index.sum { |master, n| (client_addresses(node_client(master)) - clients[n]).size }
    expect(new_clients).to eq(open - warm_open)
    masters.each { |master| expect(leftovers(master)).to eq([]) }
  end
end
