# frozen_string_literal: true

# The gem's uncontended nonblocking_lock against the floor: the same round trips from plain Rust
# (ext/lock_manager/examples/floor.rs), on the same Redis in the same run. With 1 thread (one
# connection) and with 8 (each thread its own connection and key, as bench/locks.rb's 8 threads).
#
#   bundle exec ruby bench/floor.rb
#
# Builds the example with cargo, starts a throwaway redis-server unless REDIS_URL is set, and
# measures for BENCH_SECONDS (default 3) each: unpinned, then with the client and the throwaway
# redis-server on CPU 0 (`taskset`, when installed; a REDIS_URL server is left where it is).

require "English"
require_relative "support"

SECONDS = Float(ENV.fetch("BENCH_SECONDS", "3"))
FLOOR = Bench.example("floor")

THREADS = [1, 8].freeze

# @return [Float] cycles/s of the Rust floor on `threads` connections, run under `prefix` (e.g. taskset)
def floor(url, prefix, threads)
  output = IO.popen([*prefix, FLOOR, url, SECONDS.to_s, threads.to_s], &:read)
  raise "the floor example failed: #{output}" unless $CHILD_STATUS.success? && output =~ %r{= ([\d.]+) cycles/s}

  Float(Regexp.last_match(1))
end

# @return [Float] cycles/s of the gem's nonblocking_lock in this thread
def gem(locker)
  Bench.lock_cycles(locker, "bench:floor:warm-up", count: 1000)
  start = Bench.now
  Bench.lock_cycles(locker, "bench:floor:#{Process.pid}", deadline: start + SECONDS) / (Bench.now - start)
end

# @return [Float] cycles/s of the gem's nonblocking_lock on `threads` threads, each on its own key
def gem_threads(locker, threads)
  start = Bench.now
  workers = Array.new(threads) do |i|
    Thread.new { Bench.lock_cycles(locker, "bench:floor:#{Process.pid}:#{i}", deadline: start + SECONDS) }
  end
  workers.sum(&:value) / (Bench.now - start)
end

def share(gem, floor)
  format("%<gem>6.0f cycles/s = %<share>4.1f%%", gem: gem, share: gem / floor * 100)
end

# The gem on the main thread (alone: Ruby 3.1 then starts a helper thread around every GVL-free call,
# unless the unblocking function is async-signal-safe, as ours is on Linux) and on a thread of its
# own (what Sidekiq's and Puma's threads are, and what bench/locks.rb measures).
def row(label, url, prefix, locker)
  THREADS.map do |threads|
    floor = floor(url, prefix, threads)
    gem = if threads == 1
            "main thread #{share(gem(locker), floor)}, other thread #{share(Thread.new { gem(locker) }.value, floor)}"
          else
            "#{threads} threads #{share(gem_threads(locker, threads), floor)}"
          end
    format("%<label>-9s %<threads>d thread%<s>-2s floor %<floor>6.0f cycles/s   gem: %<gem>s of floor",
           label: label, threads: threads, s: threads > 1 ? "s" : "", floor: floor, gem: gem)
  end
end

# Puts this process (every thread) and, when this run started it, redis-server on CPU 0.
def pin(url)
  pids = [Process.pid]
  pids << Redis.new(url: url).then { |r| r.info("server")["process_id"].tap { r.close } } unless ENV["REDIS_URL"]
  pids.each { |pid| system("taskset", "-a", "-p", "-c", "0", pid.to_s, out: File::NULL, exception: true) }
end

url = Bench.redis_url
Bench.header(url)
puts "#{SECONDS} s per measurement", ""
locker = LockManager::Locker.new(redis_url: url, pool_size: THREADS.max)
puts row("unpinned", url, [], locker)
if system("which", "taskset", out: File::NULL)
  pin(url)
  puts row("pinned", url, %w[taskset -c 0], locker)
else
  puts "pinned    n/a (taskset is not installed)"
end
