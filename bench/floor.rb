# frozen_string_literal: true

# The gem's 1-thread uncontended nonblocking_lock against the floor: the same two commands from
# plain Rust on one connection (ext/lock_manager/examples/floor.rs), on the same Redis in the same run.
#
#   bundle exec ruby bench/floor.rb
#
# Builds the example with cargo, starts a throwaway redis-server unless REDIS_URL is set, and
# measures for BENCH_SECONDS (default 3) each: unpinned, then with the client and the throwaway
# redis-server on CPU 0 (`taskset`, when installed; a REDIS_URL server is left where it is).

require "English"
require "open3"
require "rbconfig"
require_relative "support"

SECONDS = Float(ENV.fetch("BENCH_SECONDS", "3"))
ROOT = File.expand_path("..", __dir__)
FLOOR = File.join(ROOT, "target/release/examples/floor")

# @return [Float] cycles/s of the Rust floor, run under `prefix` (e.g. taskset)
def floor(url, prefix)
  output = IO.popen([*prefix, FLOOR, url, SECONDS.to_s], &:read)
  raise "the floor example failed: #{output}" unless $CHILD_STATUS.success? && output =~ %r{= ([\d.]+) cycles/s}

  Float(Regexp.last_match(1))
end

# @return [Float] cycles/s of the gem's nonblocking_lock in this thread
def gem(locker)
  Bench.lock_cycles(locker, "bench:floor:warm-up", count: 1000)
  start = Bench.now
  Bench.lock_cycles(locker, "bench:floor:#{Process.pid}", deadline: start + SECONDS) / (Bench.now - start)
end

# The gem on the main thread (alone: Ruby 3.1 then starts a helper thread around every GVL-free call)
# and on a thread of its own (what Sidekiq's and Puma's threads are, and what bench/locks.rb measures).
def row(label, floor, locker)
  gems = [gem(locker), Thread.new { gem(locker) }.value]
  format("%<label>-9s floor %<floor>6.0f cycles/s   gem: main thread %<main>6.0f cycles/s = %<main_share>4.1f%%, " \
         "other thread %<other>6.0f cycles/s = %<other_share>4.1f%% of floor",
         label: label, floor: floor, main: gems[0], main_share: gems[0] / floor * 100,
         other: gems[1], other_share: gems[1] / floor * 100)
end

# Puts this process (every thread) and, when this run started it, redis-server on CPU 0.
def pin(url)
  pids = [Process.pid]
  pids << Redis.new(url: url).then { |r| r.info("server")["process_id"].tap { r.close } } unless ENV["REDIS_URL"]
  pids.each { |pid| system("taskset", "-a", "-p", "-c", "0", pid.to_s, out: File::NULL, exception: true) }
end

# Cargo builds the crate's library before any example: when that fails (the library is being
# edited), the floor built before is still the same program.
cargo_output, built = Open3.capture2e({ "RUBY" => RbConfig.ruby }, "cargo", "build", "--quiet", "--release",
                                      "--example", "floor", chdir: ROOT)
unless built.success?
  abort "cannot build the floor example:\n#{cargo_output}" unless File.executable?(FLOOR)
  warn "cargo build failed: using the floor example built before (#{File.mtime(FLOOR)})"
end
url = Bench.redis_url
Bench.header(url)
puts "#{SECONDS} s per measurement", ""
locker = LockManager::Locker.new(redis_url: url, pool_size: 1)
puts row("unpinned", floor(url, []), locker)
if system("which", "taskset", out: File::NULL)
  pin(url)
  puts row("pinned", floor(url, %w[taskset -c 0]), locker)
else
  puts "pinned    n/a (taskset is not installed)"
end
