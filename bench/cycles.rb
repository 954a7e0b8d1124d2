# frozen_string_literal: true

# bench/rubies.rb's worker: `ruby bench/cycles.rb URL THREADS SECONDS` runs THREADS threads of
# uncontended nonblocking_lock cycles (each on its own key) for SECONDS and prints
# "cycles <ruby version> <cycles> <wall seconds> <process CPU seconds>".

require_relative "../lib/lock_manager"

url, threads, seconds = ARGV
threads = Integer(threads)
locker = LockManager::Locker.new(redis_url: url, pool_size: threads)
locker.nonblocking_lock("bench:warm:#{Process.pid}") {} # connected before the clock starts

clock = ->(id = Process::CLOCK_MONOTONIC) { Process.clock_gettime(id) }
GC.start
cpu_start = clock.call(Process::CLOCK_PROCESS_CPUTIME_ID)
start = clock.call
deadline = start + Float(seconds)
workers = Array.new(threads) do |i|
  Thread.new do
    key = "bench:#{Process.pid}:#{i}"
    count = 0
    while clock.call < deadline
      raise "nonblocking_lock(#{key}) did not run its block" unless locker.nonblocking_lock(key) {}.run?

      count += 1
    end
    count
  end
end
cycles = workers.sum(&:value)
puts "cycles #{RUBY_VERSION[/\A\d+\.\d+/]} #{cycles} #{clock.call - start} " \
     "#{clock.call(Process::CLOCK_PROCESS_CPUTIME_ID) - cpu_start}"
