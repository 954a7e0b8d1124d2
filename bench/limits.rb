# frozen_string_literal: true

# Rate limiter decisions (LockManager::Limiter#try_acquire, 1 thread) of each kind: GCRA (rate:),
# fixed window and sliding window, against an uncontended plain lock cycle (nonblocking_lock with an
# empty block), all on the same Redis, alternating in rounds. Every decision is admitted: the rules
# are wider than one thread can use (a refusal stops the script as a bug).
#
#   bundle exec ruby bench/limits.rb
#
# Starts a throwaway redis-server on a free loopback port unless REDIS_URL is set.
# BENCH_SECONDS (default 3) is the measured time per workload.
#
# The target (the limiters' issue): a decision is at most 1 round trip, and its client CPU at most
# 1.2x the plain acquire's. The gem does not expose the acquire alone: it is taken as half a lock
# cycle's client CPU (a cycle is acquire + release, two round trips). Round trips are counted as
# Redis's EVALSHA and EVAL calls (INFO commandstats) over COUNTED decisions of each kind.

require "etc"
require_relative "support"

DURATION = Float(ENV.fetch("BENCH_SECONDS", "3"))
ROUNDS = 10 # each measurement is split into rounds, alternating the workloads against noise
WARMUP = [DURATION / 10, 0.3].min
COUNTED = 1000 # decisions of each kind whose Redis commands are counted
CPU_TARGET = 1.2 # wanted at most: decision client CPU / the plain acquire's
ROUND_TRIP_TARGET = 1 # wanted at most: script calls per decision
SLIDING_LIMIT = 100_000

class BenchBug < StandardError; end

# @return [Integer] how many decisions `limiter` made, `count` of them or as many as fit before
#   `deadline`, each admitted
def decisions(limiter, count: nil, deadline: nil)
  done = 0
  while count ? done < count : Bench.now < deadline
    raise BenchBug, "#{limiter.inspect} refused a decision" unless limiter.try_acquire.admitted?

    done += 1
  end
  done
end

# Runs the block (it gets the deadline, returns how many operations ran) for `seconds`.
# @return [Array(Integer, Float, Float, Float)] operations, wall seconds, process CPU seconds,
#   redis-server CPU seconds
def run(seconds)
  GC.start # each round pays for its own garbage only
  cpu_start = Bench.now(Process::CLOCK_PROCESS_CPUTIME_ID)
  redis_start = Bench.redis_cpu(REDIS)
  start = Bench.now
  done = yield start + seconds
  [done, Bench.now - start, Bench.now(Process::CLOCK_PROCESS_CPUTIME_ID) - cpu_start,
   Bench.redis_cpu(REDIS) - redis_start]
end

# Calls of EVALSHA and EVAL since the server started (INFO commandstats), and of every command but
# INFO, those scripts run included.
def script_calls
  calls = REDIS.info("commandstats").transform_values { |stats| Integer(stats["calls"]) }.except("info")
  [calls.values_at("evalsha", "eval").sum(&:to_i), calls.values.sum]
end

# @return [Array(Float, Float)] script calls and all commands per decision, over COUNTED decisions
def round_trips(limiter)
  decisions(limiter, count: 10) # the script loaded, the connection made
  scripts_before, all_before = script_calls
  decisions(limiter, count: COUNTED)
  scripts, all = script_calls
  [(scripts - scripts_before).fdiv(COUNTED), (all - all_before).fdiv(COUNTED)]
end

# A line of the table: the label, then each figure formatted with `figure_format`, in columns.
def row(label, figures, figure_format)
  label.ljust(34) + figures.map { |figure| format(figure_format, figure).rjust(15) }.join
end

url = Bench.redis_url
REDIS = Redis.new(url: url)
Bench.header(url)
puts "#{DURATION} s per workload in #{ROUNDS} alternating rounds, after #{WARMUP} s of warm-up, " \
     "1 thread, #{Etc.nprocessors} cores"

locker = LockManager::Locker.new(redis_url: url, pool_size: 1)
prefix = "bench:#{Process.pid}"
limiters = {
  gcra: LockManager::Limiter.new("#{prefix}:gcra", rate: 1_000_000, per: 1, burst: 1_000_000, locker: locker),
  window: LockManager::Limiter.window("#{prefix}:window", 1_000_000_000, per: 3600, locker: locker),
  sliding: LockManager::Limiter.sliding_window("#{prefix}:sliding", SLIDING_LIMIT, per: 1, locker: locker)
}
runners = limiters.transform_values { |limiter| ->(deadline) { decisions(limiter, deadline: deadline) } }
runners[:cycle] = ->(deadline) { Bench.lock_cycles(locker, "#{prefix}:lock", deadline: deadline) }

begin
  runners.each_value { |runner| run(WARMUP, &runner) }
  totals = runners.transform_values { [0, 0.0, 0.0, 0.0] }
  ROUNDS.times do |round|
    (round.even? ? runners : runners.reverse_each).each do |name, runner|
      totals[name] = totals[name].zip(run(DURATION / ROUNDS, &runner)).map(&:sum)
    end
  end
  # One decision more says how many units the sliding window holds: those of the last second.
  held = SLIDING_LIMIT - limiters[:sliding].try_acquire.remaining
  trips = limiters.transform_values { |limiter| round_trips(limiter) }
rescue BenchBug => e
  abort "BUG: #{e.message}"
end

rates = totals.transform_values { |(done, wall, *)| done / wall }
cpu = totals.transform_values { |(done, _wall, client, _redis)| client / done * 1e6 }
redis_cpu = totals.transform_values { |(done, _wall, _client, redis)| redis / done * 1e6 }
acquire = cpu[:cycle] / 2
names = { gcra: "GCRA", window: "fixed window", sliding: "sliding window", cycle: "lock cycle" }

puts "", row("per operation", names.values, "%s")
puts row("operations/s", rates.values, "%.0f")
puts row("client CPU (µs)", cpu.values, "%.1f")
puts row("redis-server CPU (µs)", redis_cpu.values, "%.1f")
puts row("client CPU / plain acquire's", limiters.keys.map { |kind| cpu[kind] / acquire }, "%.2fx")
puts row("script calls (EVALSHA + EVAL)", trips.values.map(&:first), "%.2f")
puts row("Redis commands, the script's too", trips.values.map(&:last), "%.2f")
puts "", format("plain acquire: half a lock cycle's client CPU (a cycle is acquire + release, two round trips) " \
                "= %<acquire>.1f µs", acquire: acquire)
puts "sliding window: measured admitting; its set held #{held} members after the run (the last 1 s of units, " \
     "#{SLIDING_LIMIT} at most)"
puts "round trips: #{COUNTED} decisions of each kind, counted by INFO commandstats on a separate redis-rb client"

puts ""
limiters.each_key do |kind|
  ratio = cpu[kind] / acquire
  puts format("%<kind>s: client CPU per decision / plain acquire's %<ratio>.2fx, wanted <= %<target>sx: %<verdict>s",
              kind: names[kind], ratio: ratio, target: CPU_TARGET, verdict: Bench.verdict(ratio, CPU_TARGET))
  per = trips[kind].first
  puts format("%<kind>s: round trips per decision %<per>.2f, wanted <= %<target>d: %<verdict>s",
              kind: names[kind], per: per, target: ROUND_TRIP_TARGET, verdict: Bench.verdict(per, ROUND_TRIP_TARGET))
end
