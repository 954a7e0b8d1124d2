# frozen_string_literal: true

# Does the gem leak? Resident memory of this process across CYCLES (default 1,000,000) uncontended
# nonblocking_lock cycles in one thread, after a 20,000-cycle warm-up.
#
#   bundle exec ruby bench/memory.rb        # CYCLES=100000 for a quick run
#
# Starts a throwaway redis-server on a free loopback port unless REDIS_URL is set. Linux only
# (reads VmRSS from /proc/self/status).

require_relative "support"

CYCLES = Integer(ENV.fetch("CYCLES", "1000000"))
WARM_UP = 20_000
TARGET = 5.0 # MB of growth, at most

# @return [Float] this process's resident set, in MB, after a full GC
def rss_mb
  GC.start
  Integer(File.read("/proc/self/status")[/^VmRSS:\s*(\d+) kB/, 1]) / 1024.0
end

url = Bench.redis_url
Bench.header(url)
locker = LockManager::Locker.new(redis_url: url, pool_size: 1)
key = "bench:memory:#{Process.pid}"
Bench.lock_cycles(locker, key, count: WARM_UP)
before = rss_mb
start = Bench.now
Bench.lock_cycles(locker, key, count: CYCLES)
seconds = Bench.now - start
after = rss_mb
puts "", format("nonblocking_lock, 1 thread: %<cycles>d cycles in %<seconds>.1f s, RSS %<before>.1f MB -> " \
                "%<after>.1f MB, growth %<growth>.2f MB (target < %<target>.0f MB): %<verdict>s",
                cycles: CYCLES, seconds: seconds, before: before, after: after, growth: after - before,
                target: TARGET, verdict: Bench.verdict(after - before, TARGET))
