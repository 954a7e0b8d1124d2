# frozen_string_literal: true

# Uncontended nonblocking_lock throughput and client CPU: this gem against the seed design
# (bench/baseline.rb), both on the same Redis in the same run.
#
#   bundle exec ruby bench/locks.rb
#
# Starts a throwaway redis-server on a free loopback port unless REDIS_URL is set.
# BENCH_SECONDS (default 3) is the measured time per workload and implementation.
# On a small VM the 1-thread numbers swing with whether client and Redis share a CPU;
# `taskset -c 0 bundle exec ruby bench/locks.rb` keeps them on one CPU and makes them steady.

require "etc"
require_relative "support"
require_relative "baseline"

DURATION = Float(ENV.fetch("BENCH_SECONDS", "3"))
ROUNDS = 10 # each measurement is split into rounds, alternating gem and baseline against noise
WARMUP = [DURATION / 10, 0.3].min
TARGETS = { 1 => 1.5, 8 => 3.0 }.freeze # wanted gem/baseline ops/s, per thread count (issue 4)
CPU_TARGET = 0.5 # wanted at most: gem/baseline client CPU per cycle, 1 thread (issue 4)

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

def lockers(url, pool_size)
  {
    gem: LockManager::Locker.new(redis_url: url, pool_size: pool_size),
    baseline: Baseline::Locker.new(pool_size: pool_size, redis: { url: url })
  }
end

# @return [Hash{Symbol => Array(Integer, Float, Float)}] #run's numbers summed, for :gem and :baseline
def compare(url, threads)
  lockers = lockers(url, threads)
  lockers.each { |name, locker| run(name, locker, threads, WARMUP) }
  totals = lockers.transform_values { [0, 0.0, 0.0, 0.0] }
  ROUNDS.times do |round|
    (round.even? ? lockers : lockers.reverse_each).each do |name, locker|
      totals[name] = totals[name].zip(run(name, locker, threads, DURATION / ROUNDS)).map(&:sum)
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

def row(label, gem, baseline, unit, note = "")
  format("%<label>-31s %<gem>9.1f %<unit>-5s %<baseline>9.1f %<unit>-5s %<ratio>11.2fx %<note>s",
         label: label, gem: gem, baseline: baseline, unit: unit, ratio: gem / baseline, note: note).rstrip
end

url = Bench.redis_url
REDIS = Redis.new(url: url)
puts "ruby:         #{RUBY_DESCRIPTION}"
puts "redis-server: #{REDIS.info("server")["redis_version"]} (#{ENV["REDIS_URL"] ? "REDIS_URL" : "throwaway"})"
puts "date:         #{Time.now.strftime("%F %T %z")}, #{Etc.nprocessors} cores"
puts "#{DURATION} s per measurement in #{ROUNDS} alternating rounds, after #{WARMUP} s of warm-up"

puts "", format("%<workload>-31s %<gem>15s %<baseline>15s %<ratio>12s",
                workload: "workload", gem: "gem", baseline: "baseline", ratio: "gem/baseline")
ratios = {}
cpu_ratio = nil
begin
  TARGETS.each_key do |threads|
    gem, baseline = compare(url, threads).values_at(:gem, :baseline)
    ratios[threads] = ops_per_second(gem) / ops_per_second(baseline)
    puts row("nonblocking_lock, #{threads} thread#{"s" if threads > 1}",
             ops_per_second(gem), ops_per_second(baseline), "ops/s")
    puts row("  cores busy (client + redis)", cores_busy(gem), cores_busy(baseline), "cores")
    puts row("  redis-server busy (its 1 core)", redis_busy(gem) * 100, redis_busy(baseline) * 100, "%")
    puts row("  redis-server CPU per cycle", redis_us_per_cycle(gem), redis_us_per_cycle(baseline), "µs")
    puts row("  client CPU per cycle", cpu_us_per_cycle(gem), cpu_us_per_cycle(baseline), "µs") if threads > 1
    next unless threads == 1

    cpu_ratio = cpu_us_per_cycle(gem) / cpu_us_per_cycle(baseline)
    puts row("client CPU per cycle, 1 thread", cpu_us_per_cycle(gem), cpu_us_per_cycle(baseline),
             "µs", "(lower is better)")
  end
rescue BenchBug => e
  abort "BUG: #{e.message}"
end

puts
TARGETS.each do |threads, target|
  verdict = ratios[threads] >= target ? "target met" : "target NOT met"
  puts "#{threads} thread#{"s" if threads > 1}: gem/baseline #{ratios[threads].round(2)}x, " \
       "wanted >= #{target}x: #{verdict}"
end
verdict = cpu_ratio <= CPU_TARGET ? "target met" : "target NOT met"
puts "client CPU, 1 thread: gem/baseline #{cpu_ratio.round(2)}x, wanted <= #{CPU_TARGET}x: #{verdict}"
