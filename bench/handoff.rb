# frozen_string_literal: true

# One key, several contenders: how fast and how fairly the lock passes from holder to waiter.
# This gem (default and fair: true) against the seed design (bench/baseline.rb), on the same
# Redis in the same run.
#
#   bundle exec ruby bench/handoff.rb
#
# Starts a throwaway redis-server on a free loopback port unless REDIS_URL is set.
#   threads    4 threads x 25 blocking_lock turns at one key, each holding it 2 ms: the total time
#              against the ideal 100 x 2 ms, and each turn's wait (call to block entry)
#   processes  the same with 4 forked processes
#   latency    a holder leaves its block while another thread already waits in blocking_lock: the
#              time from the holder's last instant in its block to the waiter's first in its own
#              (ROUNDS of them, default 200)

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

# One way to lock: the gem with some blocking_lock options, or the baseline.
Implementation = Struct.new(:name, :options) do
  def gem?
    name.start_with?("gem")
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

IMPLEMENTATIONS = [Implementation.new("gem", {}), Implementation.new("gem fair: true", { fair: true }),
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

def in_processes(impl, url, key, start_at)
  Array.new(WORKERS) { fork_worker(impl, url, key, start_at) }.map do |pid, reader|
    result = Marshal.load(reader.read) # rubocop:disable Security/MarshalLoad -- from our own child
    Process.wait(pid)
    raise result if result.is_a?(Exception)

    result
  end
end

# @return [Array<String, nil>] the row's figures and verdicts
def contention(workload, impl, url)
  start_at = Bench.now + 0.5 # time for every worker to connect, and for the children to start
  key = "bench:handoff:#{Process.pid}:#{workload}:#{impl.name}"
  results = workload == "threads" ? in_threads(impl, url, key, start_at) : in_processes(impl, url, key, start_at)
  waits = results.flat_map(&:first)
  ratio = (results.map(&:last).max - start_at) / IDEAL
  p50, p99 = [0.5, 0.99].map { |fraction| Bench.percentile(waits, fraction) }
  [format("%<ratio>5.2fx ideal   wait p50 %<p50>8s  p99 %<p99>8s",
          ratio: ratio, p50: Bench.ms(p50), p99: Bench.ms(p99)),
   ("wall: #{Bench.verdict(ratio, WALL_TARGET)}" if impl.gem?),
   ("p99: #{Bench.verdict(p99, P99_TARGET)}" if impl.options[:fair])]
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

url = Bench.redis_url
Bench.header(url)
puts "#{WORKERS} x #{TURNS} turns holding #{Bench.ms(HOLD)} (ideal #{IDEAL} s; " \
     "targets: wall <= #{WALL_TARGET}x ideal, fair p99 <= #{Bench.ms(P99_TARGET)}); " \
     "latency: #{ROUNDS} rounds (target: median <= #{Bench.ms(LATENCY_TARGET)})", ""
%w[threads processes latency].each do |workload|
  IMPLEMENTATIONS.each do |impl|
    cells = if !impl.available?
              [Bench::FAIR_NOT_AVAILABLE]
            elsif workload == "latency"
              latency(impl, url)
            else
              contention(workload, impl, url)
            end
    puts [format("%<workload>-10s %<impl>-15s", workload: workload, impl: impl.name), *cells.compact].join("   ")
  end
end
