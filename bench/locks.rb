# frozen_string_literal: true

# Uncontended nonblocking_lock throughput and client CPU: this gem against the seed design
# (bench/baseline.rb), and the floor under both: the gem's own round trips sent by Rust with no
# Ruby in the loop (ext/lock_manager/examples/floor.rs), all on the same Redis in the same run.
# A target the floor misses too is bounded by Redis and the machine's socket calls, not by Ruby.
#
#   bundle exec ruby bench/locks.rb
#
# Starts a throwaway redis-server on a free loopback port unless REDIS_URL is set.
# BENCH_SECONDS (default 3) is the measured time per workload and implementation.
# On a small VM the 1-thread numbers swing with whether client and Redis share a CPU;
# `taskset -c 0 bundle exec ruby bench/locks.rb` keeps them on one CPU and makes them steady.

require "English"
require "etc"
require_relative "support"
require_relative "baseline"

DURATION = Float(ENV.fetch("BENCH_SECONDS", "3"))
ROUNDS = 10 # each measurement is split into rounds, alternating the implementations against noise
WARMUP = [DURATION / 10, 0.3].min
TARGETS = { 1 => 1.5, 8 => 3.0 }.freeze # wanted gem/baseline ops/s, per thread count (issue 4)
CPU_TARGET = 0.5 # wanted at most: gem/baseline client CPU per cycle, 1 thread (issue 4)

FLOOR = Bench.example("floor")
FLOOR_LINE = %r{floor: (?<cycles>\d+) cycles in (?<wall>[\d.]+) s = [\d.]+ cycles/s, (?<cpu>[\d.]+) s CPU}

class BenchBug < StandardError; end

# `threads` threads lock and unlock their own key in a loop for `seconds`.
# @return [Array(Integer, Float, Float, Float)] cycles, wall seconds, process CPU seconds,
#   redis-server CPU seconds
def run(name, locker, threads, seconds)
  GC.start # each round pays for its own garbage only, not for the other implementation's
  cpu_start = Bench.now(Process::CLOCK_PROCESS_CPUTIME_ID)
  redis_start = Bench.redis_cpu(REDIS)
  start = Bench.now
  workers = Array.new(threads) do |i|
    Thread.new { cycles(name, locker, "bench:#{Process.pid}:#{name}:#{i}", start + seconds) }
  end
  cycles = workers.sum(&:value)
  [cycles, Bench.now - start, Bench.now(Process::CLOCK_PROCESS_CPUTIME_ID) - cpu_start,
   Bench.redis_cpu(REDIS) - redis_start]
end

# @return [Integer] how many lock + empty block + unlock cycles ran before `deadline`
def cycles(name, locker, key, deadline)
  count = 0
  while Bench.now < deadline
    result = locker.nonblocking_lock(key, timeout: 30) {}
    raise BenchBug, "#{name}: nonblocking_lock(#{key.inspect}) did not run its block" unless result.run?

    count += 1
  end
  count
end

# The floor in a process of its own: `threads` threads, each with a connection and key.
# @return [Array(Integer, Float, Float, Float)] as #run, the CPU being the floor process's own
def run_floor(url, threads, seconds)
  redis_start = Bench.redis_cpu(REDIS)
  output = IO.popen([FLOOR, url, seconds.to_s, threads.to_s], &:read)
  measured = output.match(FLOOR_LINE)
  raise BenchBug, "floor: the example failed: #{output}" unless $CHILD_STATUS.success? && measured

  [Integer(measured[:cycles]), Float(measured[:wall]), Float(measured[:cpu]), Bench.redis_cpu(REDIS) - redis_start]
end

# How each implementation runs `threads` threads for `seconds`.
# @return [Hash{Symbol => Proc}] for :gem, :baseline and :floor
def runners(url, threads)
  gem = LockManager::Locker.new(redis_url: url, pool_size: threads)
  baseline = Baseline::Locker.new(pool_size: threads, redis: { url: url })
  {
    gem: ->(seconds) { run(:gem, gem, threads, seconds) },
    baseline: ->(seconds) { run(:baseline, baseline, threads, seconds) },
    floor: ->(seconds) { run_floor(url, threads, seconds) }
  }
end

# @return [Hash{Symbol => Array(Integer, Float, Float, Float)}] #run's numbers summed, per implementation
def compare(url, threads)
  runners = runners(url, threads)
  runners.each_value { |runner| runner.call(WARMUP) }
  totals = runners.transform_values { [0, 0.0, 0.0, 0.0] }
  ROUNDS.times do |round|
    (round.even? ? runners : runners.reverse_each).each do |name, runner|
      totals[name] = totals[name].zip(runner.call(DURATION / ROUNDS)).map(&:sum)
    end
  end
  totals
end

def ops_per_second((cycles, wall, *))
  cycles / wall
end

def cpu_us_per_cycle((cycles, _wall, cpu, _redis))
  cpu / cycles * 1e6
end

# How many cores the client and redis-server kept busy together: at the machine's core count,
# throughput is bounded by CPU, not by either implementation's waiting.
def cores_busy((_cycles, wall, cpu, redis))
  (cpu + redis) / wall
end

# How busy redis-server kept its one core (it runs commands on one thread): near 1, Redis itself
# bounds the throughput.
def redis_busy((_cycles, wall, _cpu, redis))
  redis / wall
end

def redis_us_per_cycle((cycles, _wall, _cpu, redis))
  redis / cycles * 1e6
end

# One line: a figure of the gem, the baseline and the floor, then gem/baseline, floor/baseline
# and gem/floor.
def row(label, totals, unit, note = "")
  gem, baseline, floor = totals.values_at(:gem, :baseline, :floor)
  format("%<label>-31s %<gem>9.1f %<unit>-5s %<baseline>9.1f %<unit>-5s %<floor>9.1f %<unit>-5s " \
         "%<ratio>11.2fx %<floor_ratio>13.2fx %<gem_floor>9.2fx %<note>s",
         label: label, gem: gem, baseline: baseline, floor: floor, unit: unit, ratio: gem / baseline,
         floor_ratio: floor / baseline, gem_floor: gem / floor, note: note).rstrip
end

# A target's line: gem/baseline against it and, when the floor misses it too, the floor's ratio.
# @param figures [Hash{Symbol => Float}] the measured figure of :gem, :baseline and :floor
def target_line(label, figures, target, at_most: false)
  ratio, floor_ratio = figures.values_at(:gem, :floor).map { |figure| figure / figures[:baseline] }
  verdict = Bench.verdict_beside_floor(ratio, floor_ratio, target, at_most: at_most)
  format("%<label>s: gem/baseline %<ratio>.2fx, wanted %<sign>s %<target>sx: %<verdict>s",
         label: label, ratio: ratio, sign: at_most ? "<=" : ">=", target: target, verdict: verdict)
end

url = Bench.redis_url
REDIS = Redis.new(url: url)
puts "ruby:         #{RUBY_DESCRIPTION}"
puts "redis-server: #{REDIS.info("server")["redis_version"]} (#{ENV["REDIS_URL"] ? "REDIS_URL" : "throwaway"})"
puts "date:         #{Time.now.strftime("%F %T %z")}, #{Etc.nprocessors} cores"
puts "#{DURATION} s per measurement in #{ROUNDS} alternating rounds, after #{WARMUP} s of warm-up"

puts "", format("%<workload>-31s %<gem>15s %<baseline>15s %<floor>15s %<ratio>12s %<floor_ratio>14s %<gem_floor>10s",
                workload: "workload", gem: "gem", baseline: "baseline", floor: "floor (Rust)", ratio: "gem/baseline",
                floor_ratio: "floor/baseline", gem_floor: "gem/floor")
verdicts = []
begin
  TARGETS.each do |threads, target|
    totals = compare(url, threads)
    rates = totals.transform_values { |measured| ops_per_second(measured) }
    puts row("nonblocking_lock, #{threads} thread#{"s" if threads > 1}", rates, "ops/s")
    puts row("  cores busy (client + redis)", totals.transform_values { |m| cores_busy(m) }, "cores")
    puts row("  redis-server busy (its 1 core)", totals.transform_values { |m| redis_busy(m) * 100 }, "%")
    puts row("  redis-server CPU per cycle", totals.transform_values { |m| redis_us_per_cycle(m) }, "µs")
    cpu = totals.transform_values { |measured| cpu_us_per_cycle(measured) }
    puts row("  client CPU per cycle", cpu, "µs", threads == 1 ? "(lower is better)" : "")
    verdicts << target_line("#{threads} thread#{"s" if threads > 1}", rates, target)
    verdicts << target_line("client CPU, 1 thread", cpu, CPU_TARGET, at_most: true) if threads == 1
  end
rescue BenchBug => e
  abort "BUG: #{e.message}"
end

puts "", verdicts
