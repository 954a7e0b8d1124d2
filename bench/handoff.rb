# frozen_string_literal: true

# One key, several contenders: how fast and how fairly the lock passes from holder to waiter.
# This gem (default and fair: true) against the seed design (bench/baseline.rb), on the same
# Redis in the same run, and against the floor: the gem's own lock core driven by Rust threads or
# processes with no Ruby in the loop (ext/lock_manager/examples/handoff_floor.rs).
#
#   bundle exec ruby bench/handoff.rb
#
# Starts a throwaway redis-server on a free loopback port unless REDIS_URL is set.
#   threads    4 threads x 25 blocking_lock turns at one key, each holding it 2 ms: the total time
#              against the ideal 100 x 2 ms (the median of REPEATS runs, default 3), and each
#              turn's wait (call to block entry); the gem's rows also show their total time
#              against the floor's with the same options
#   processes  the same with 4 forked processes (the floor: 4 processes of the example)
#   latency    a holder leaves its block while another thread already waits in blocking_lock: the
#              time from the holder's last instant in its block to the waiter's first in its own
#              (ROUNDS of them, default 200)
#   listeners  the gem's processes runs again while LISTENERS more processes (default 16) wait
#              for a key no one releases: the CPU those processes and Redis spend per hand-off
#              (a hand-off is published to the new holder's process alone)

require "English"
require "etc"
require "digest/sha1" # before the threads: the baseline's first Digest::SHA1 autoload is not thread-safe
require_relative "support"
require_relative "baseline"

HOLD = 0.002                            # each turn's critical section, seconds
WORKERS = 4
TURNS = 25                              # per worker
IDEAL = WORKERS * TURNS * HOLD
WALL_TARGET = 1.25                      # total time, at most this times IDEAL
P99_TARGET = (WORKERS * HOLD) + 0.005   # a turn's p99 wait, with fair: true
ROUNDS = Integer(ENV.fetch("ROUNDS", "200"))
LATENCY_HOLD = 0.02                     # long enough for the waiter to be waiting
LATENCY_TARGET = 0.001                  # median release-to-acquire
WARM_UP_ROUNDS = 5                      # latency rounds run first and not counted
REPEATS = Integer(ENV.fetch("REPEATS", "3")) # contention runs of each implementation
LISTENERS = Integer(ENV.fetch("LISTENERS", "16"))

FLOOR = Bench.example("handoff_floor")

# One way to lock: the gem with some blocking_lock options, the floor under it, or the baseline.
Implementation = Struct.new(:name, :options) do
  def gem?
    name.start_with?("gem")
  end

  def floor?
    name.start_with?("floor")
  end

  # The floor's processes share the wall clock, not Ruby's monotonic one.
  def clock
    floor? ? Process::CLOCK_REALTIME : Process::CLOCK_MONOTONIC
  end

  def available?
    !options.key?(:fair) || Bench::FAIR
  end

  def locker(url, pool_size)
    return LockManager::Locker.new(redis_url: url, pool_size: pool_size) if gem?

    Baseline::Locker.new(pool_size: pool_size, redis: { url: url })
  end

  def blocking_lock(locker, key, &block)
    locker.blocking_lock(key, timeout: 30, **options, &block)
  end
end

IMPLEMENTATIONS = [Implementation.new("floor (Rust)", {}), Implementation.new("floor fair: true", { fair: true }),
                   Implementation.new("gem", {}), Implementation.new("gem fair: true", { fair: true }),
                   Implementation.new("baseline", {})].freeze

# One worker's turns at `key`, from `start_at` (a monotonic time: the same in every process).
# @return [Array(Array<Float>, Float)] each turn's wait, and when the worker finished
def turns(impl, locker, key, start_at)
  locker.nonblocking_lock("#{key}:warm-up:#{Process.pid}:#{Thread.current.object_id}") {} # connects
  sleep([start_at - Bench.now, 0].max)
  waits = Array.new(TURNS) do
    called = Bench.now
    entered = nil
    impl.blocking_lock(locker, key) do
      entered = Bench.now
      sleep HOLD
    end
    entered - called
  end
  [waits, Bench.now]
end

def in_threads(impl, url, key, start_at)
  locker = impl.locker(url, WORKERS)
  Array.new(WORKERS) { Thread.new { turns(impl, locker, key, start_at) } }.map(&:value)
end

# Forks a worker that sends its #turns (or the exception it raised) back through a pipe.
# @return [Array(Integer, IO)] its pid, and the end to read from
def fork_worker(impl, url, key, start_at)
  Bench.fork_reporting { turns(impl, impl.locker(url, 1), key, start_at) }
end

# The floor's workers: `processes` runs of the example, `threads` worker threads in each.
# @return [Array(Array<Float>, Float)] per worker, as #turns
def floor_workers(impl, url, key, start_at, processes:, threads:)
  command = [FLOOR, url, key, threads, TURNS, HOLD * 1000, start_at, *("fair" if impl.options[:fair])].map(&:to_s)
  Array.new(processes) { IO.popen(command) }.flat_map do |output|
    lines = output.readlines
    output.close
    raise "the handoff_floor example failed: #{lines.join}" unless $CHILD_STATUS.success?

    lines.map { |line| floor_worker(line) }
  end
end

# @param line [String] "worker <finished at> <wait> <wait> ..." (seconds)
# @return [Array(Array<Float>, Float)] the worker's waits, and when it finished
def floor_worker(line)
  finished, *waits = line.split.drop(1).map { |number| Float(number) }
  [waits, finished]
end

def in_processes(impl, url, key, start_at)
  Array.new(WORKERS) { fork_worker(impl, url, key, start_at) }.map do |pid, reader|
    result = Marshal.load(reader.read) # rubocop:disable Security/MarshalLoad -- from our own child
    Process.wait(pid)
    raise result if result.is_a?(Exception)

    result
  end
end

# @return [Array<Array(Array<Float>, Float)>] per worker: its waits, and when it finished
def workers(workload, impl, url, key, start_at)
  threads = workload == "threads"
  if impl.floor?
    floor_workers(impl, url, key, start_at, processes: threads ? 1 : WORKERS, threads: threads ? WORKERS : 1)
  else
    threads ? in_threads(impl, url, key, start_at) : in_processes(impl, url, key, start_at)
  end
end

# One contention run.
# @return [Array(Float, Array<Float>)] the total time against the ideal, and every turn's wait
def contention_run(workload, impl, url, run)
  start_at = Bench.now(impl.clock) + 0.5 # time for every worker to connect, and for the children to start
  key = "bench:handoff:#{Process.pid}:#{workload}:#{impl.name}:#{run}"
  results = workers(workload, impl, url, key, start_at)
  [(results.map(&:last).max - start_at) / IDEAL, results.flat_map(&:first)]
end

# REPEATS runs of each implementation, interleaved (a slow spell of a shared machine hits them
# all); a row shows the median run's total time, the range, and the waits of every run.
# @return [Hash{Implementation => Array<String, nil>}] each row's figures and verdicts
def contention(workload, url)
  runs = Hash.new { |hash, impl| hash[impl] = [] }
  REPEATS.times do |run|
    IMPLEMENTATIONS.select(&:available?).each { |impl| runs[impl] << contention_run(workload, impl, url, run) }
  end
  floors = {}
  runs.to_h do |impl, measured|
    ratio = Bench.percentile(measured.map(&:first), 0.5)
    floors[impl.options] = ratio if impl.floor?
    [impl, contention_row(impl, measured, ratio, floors[impl.options])]
  end
end

# @param floor [Float, nil] the floor's median total time against the ideal, with the same options
# @return [Array<String, nil>] the row's figures and verdicts
def contention_row(impl, measured, ratio, floor)
  ratios = measured.map(&:first)
  p50, p99 = [0.5, 0.99].map { |fraction| Bench.percentile(measured.flat_map(&:last), fraction) }
  cells = [format("%<ratio>5.2fx ideal (%<min>.2f-%<max>.2f)   wait p50 %<p50>8s  p99 %<p99>8s",
                  ratio: ratio, min: ratios.min, max: ratios.max, p50: Bench.ms(p50), p99: Bench.ms(p99))]
  return cells unless impl.gem?

  cells << format("%.2fx floor", ratio / floor) if floor
  cells << "wall: #{Bench.verdict_beside_floor(ratio, floor, WALL_TARGET, unit: "x ideal")}"
  cells << "p99: #{Bench.verdict(p99, P99_TARGET)}" if impl.options[:fair]
  cells
end

# The waiter of #release_to_acquire: each round, once the holder holds the key, waits for it.
# @return [Thread] whose value is the instant it entered its block, per round
def waiter(impl, locker, key, waiting, done)
  Thread.new do
    Array.new(WARM_UP_ROUNDS + ROUNDS) do
      waiting.pop
      entered = nil
      impl.blocking_lock(locker, key) { entered = Bench.now }
      done << true
      entered
    end
  end
end

# @return [Array<Float>] seconds from the holder's last instant in its block to the waiter's first
def release_to_acquire(impl, url, key)
  locker = impl.locker(url, 2)
  waiting = Queue.new
  done = Queue.new
  entries = waiter(impl, locker, key, waiting, done)
  releases = Array.new(WARM_UP_ROUNDS + ROUNDS) do
    left = nil
    impl.blocking_lock(locker, key) do
      waiting << true
      sleep LATENCY_HOLD
      left = Bench.now
    end
    done.pop
    left
  end
  entries.value.zip(releases).drop(WARM_UP_ROUNDS).map { |entered, left| entered - left }
end

# @return [Array<String, nil>] the row's figures and verdict
def latency(impl, url)
  latencies = release_to_acquire(impl, url, "bench:handoff:#{Process.pid}:latency:#{impl.name}")
  median, p99 = [0.5, 0.99].map { |fraction| Bench.percentile(latencies, fraction) }
  [format("median %<median>8s  p99 %<p99>8s", median: Bench.ms(median), p99: Bench.ms(p99)),
   ("median: #{Bench.verdict(median, LATENCY_TARGET)}" if impl.gem?)]
end

# CPU seconds that `pids` (children of this process, Linux) have used so far.
def children_cpu(pids)
  ticks = pids.sum { |pid| File.read("/proc/#{pid}/stat").split[13, 2].sum(&:to_i) }
  ticks.fdiv(Etc.sysconf(Etc::SC_CLK_TCK))
end

# LISTENERS processes queued for a key that stays held, each with its subscriber listening.
# @return [Array<Integer>] their pids
def start_listeners(locker, redis, key)
  pids = Array.new(LISTENERS) { Bench.fork_reporting { locker.blocking_lock(key, timeout: 600) {} }[0] }
  sleep 0.01 until redis.zcard(KeySlots.queue_key("#{locker.settings[:key_prefix]}#{key}")) == LISTENERS
  sleep 0.6 # past the first subscriber's start: every listener has re-queued since
  pids
end

# @return [Array(Object, Float, Float)] the block's value, and the CPU microseconds `pids` and Redis
#   spent per hand-off while it ran
def cpu_per_handoff(pids, redis, handoffs)
  before = [children_cpu(pids), Bench.redis_cpu(redis)]
  value = yield
  [value, *[children_cpu(pids), Bench.redis_cpu(redis)].zip(before).map { |now, was| (now - was) / handoffs * 1e6 }]
end

# @return [Array<String>] the row's figures: per hand-off, the listeners' CPU and Redis's
def listeners(url)
  impl = IMPLEMENTATIONS.find { |i| i.name == "gem" }
  redis = Redis.new(url: url)
  locker = impl.locker(url, 1) # each listener's process has its own pool and subscriber
  held = locker.try_lock("bench:handoff:#{Process.pid}:listeners", timeout: 600)
  pids = start_listeners(locker, redis, held.key)
  ratios, listeners_us, redis_us = cpu_per_handoff(pids, redis, REPEATS * WORKERS * TURNS) do
    Array.new(REPEATS) { |run| contention_run("processes", impl, url, "listeners:#{run}").first }
  end
  [format("%<ratio>5.2fx ideal   %<count>d processes waiting on another key: their CPU %<listeners>.0f us, " \
          "Redis's %<redis>.0f us per hand-off",
          ratio: Bench.percentile(ratios, 0.5), count: LISTENERS, listeners: listeners_us, redis: redis_us)]
ensure
  pids&.each do |pid|
    Process.kill(:KILL, pid)
    Process.wait(pid) # one by one: the throwaway redis-server is a child too
  end
  held&.release
  redis&.close
end

url = Bench.redis_url
Bench.header(url)
puts "#{WORKERS} x #{TURNS} turns holding #{Bench.ms(HOLD)} (ideal #{IDEAL} s; " \
     "targets: wall <= #{WALL_TARGET}x ideal, fair p99 <= #{Bench.ms(P99_TARGET)}); " \
     "latency: #{ROUNDS} rounds (target: median <= #{Bench.ms(LATENCY_TARGET)})", ""
%w[threads processes latency].each do |workload|
  rows = workload == "latency" ? {} : contention(workload, url)
  IMPLEMENTATIONS.each do |impl|
    next if impl.floor? && workload == "latency"

    cells = impl.available? ? rows.fetch(impl) { latency(impl, url) } : [Bench::FAIR_NOT_AVAILABLE]
    puts [format("%<workload>-10s %<impl>-16s", workload: workload, impl: impl.name), *cells.compact].join("   ")
  end
end
puts [format("%<workload>-10s %<impl>-16s", workload: "listeners", impl: "gem"), *listeners(url)].join("   ")
