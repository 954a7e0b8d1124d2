# frozen_string_literal: true

# A crowd of waiters on one key: 2,000 blocking waiters (20 processes x 100 threads) on a
# `limit: 2` semaphore, against the same crowd on the plain lock, in the same run on the same
# Redis. Each holder keeps its permit for a moment (HOLD), then queues again. Target: the
# semaphore serves at least half the plain lock's acquisitions per second, with no PoolTimeout
# (nor any other error). Usage: bundle exec ruby bench/semaphore.rb [seconds per mode]

require_relative "support"

SECONDS = Float(ARGV.fetch(0, "10"))
PROCESSES = 20
THREADS = 100
HOLD = 0.001
POOL_SIZE = 10

# One acquisition: "done", or the class name of the error it raised.
def turn(locker, limit)
  locker.blocking_lock("crowd:#{limit}", limit: limit, timeout: 30) { sleep HOLD }
  "done"
rescue LockManager::Error => e
  e.class.name
end

# One process's threads, each acquiring and releasing until the deadline.
# @return [Hash{String => Integer}] "done" => acquisitions, and errors by class name
def crowd(url, limit, deadline)
  locker = LockManager::Locker.new(redis_url: url, key_prefix: "bench:semaphore:", pool_size: POOL_SIZE)
  threads = Array.new(THREADS) do
    Thread.new do
      counts = Hash.new(0)
      counts[turn(locker, limit)] += 1 while Bench.now(Process::CLOCK_REALTIME) < deadline
      counts
    end
  end
  sum(threads.map(&:value))
end

def sum(counts)
  counts.reduce(Hash.new(0)) { |total, one| total.merge(one) { |_, a, b| a + b } }
end

# @return [Array(Float, Hash)] acquisitions per second, and errors by class
def measure(url, limit)
  start = Bench.now(Process::CLOCK_REALTIME) + 2 # every process ready before the clock starts
  deadline = start + SECONDS
  children = Array.new(PROCESSES) do
    Bench.fork_reporting do
      sleep [start - Bench.now(Process::CLOCK_REALTIME), 0].max
      crowd(url, limit, deadline)
    end
  end
  reports = children.map do |pid, reader|
    report = Marshal.load(reader.read) # rubocop:disable Security/MarshalLoad
    Process.wait(pid)
    raise report if report.is_a?(Exception)

    report
  end
  total = sum(reports)
  [total.delete("done").to_i / SECONDS, total]
end

url = Bench.redis_url
Bench.header(url)
puts "#{PROCESSES} processes x #{THREADS} threads = #{PROCESSES * THREADS} blocking waiters on one key, " \
     "holding #{HOLD * 1000} ms, #{SECONDS} s per mode (pool_size #{POOL_SIZE})"
plain, plain_errors = measure(url, 1)
puts format("plain lock        %<rate>8.1f acquisitions/s   errors: %<errors>s",
            rate: plain, errors: plain_errors.inspect)
shared, shared_errors = measure(url, 2)
puts format("limit: 2          %<rate>8.1f acquisitions/s   errors: %<errors>s",
            rate: shared, errors: shared_errors.inspect)
ratio = shared / plain
puts format("limit: 2 / plain  %<ratio>8.2fx   wanted >= 0.5x, no PoolTimeout: %<verdict>s",
            ratio: ratio, verdict: ratio >= 0.5 && shared_errors.empty? ? "target met" : "target NOT met")
