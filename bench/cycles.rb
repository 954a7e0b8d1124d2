# frozen_string_literal: true

# bench/rubies.rb's worker: `ruby bench/cycles.rb URL THREADS SECONDS [WORKLOAD]` runs THREADS threads
# for SECONDS, each on its own key and connection, and prints
# "cycles <ruby version> <operations> <wall seconds> <process CPU seconds> <context switches>".
# WORKLOAD "lock" (the default): uncontended nonblocking_lock cycles. "ping": Redis PING round trips over
# Ruby's own TCPSocket (write, readpartial), the control: what Ruby's I/O pays in the same threads.
# Context switches are the threads' own (/proc/thread-self/status; 0 where there is none).

require "socket"
require "uri"
require_relative "../lib/lock_manager"

url, threads, seconds, workload = ARGV
threads = Integer(threads)
workload ||= "lock"

# Voluntary and involuntary context switches of the calling thread so far.
def switches
  status = File.read("/proc/thread-self/status")
  status.scan(/^(?:non)?voluntary_ctxt_switches:\s+(\d+)/).sum { |(count)| Integer(count) }
rescue SystemCallError
  0
end

operation =
  case workload
  when "lock"
    locker = LockManager::Locker.new(redis_url: url, pool_size: threads)
    locker.nonblocking_lock("bench:warm:#{Process.pid}") {} # connected before the clock starts
    lambda do |i|
      key = "bench:#{Process.pid}:#{i}"
      -> { locker.nonblocking_lock(key) {}.run? or raise "nonblocking_lock(#{key}) did not run its block" }
    end
  when "ping"
    address = URI(url)
    lambda do |_i|
      socket = TCPSocket.new(address.host, address.port)
      socket.setsockopt(Socket::IPPROTO_TCP, Socket::TCP_NODELAY, 1)
      lambda do
        socket.write("PING\r\n")
        socket.readpartial(16) == "+PONG\r\n" or raise "PING: an unexpected reply"
      end
    end
  else abort "workload: lock or ping, not #{workload.inspect}"
  end
runs = Array.new(threads) { |i| operation.call(i) }

clock = ->(id = Process::CLOCK_MONOTONIC) { Process.clock_gettime(id) }
GC.start
cpu_start = clock.call(Process::CLOCK_PROCESS_CPUTIME_ID)
start = clock.call
deadline = start + Float(seconds)
workers = runs.map do |run|
  Thread.new do
    count = 0
    switched = switches
    while clock.call < deadline
      run.call
      count += 1
    end
    [count, switches - switched]
  end
end
done, switched = workers.map(&:value).transpose.map(&:sum)
puts "cycles #{RUBY_VERSION[/\A\d+\.\d+/]} #{done} #{clock.call - start} " \
     "#{clock.call(Process::CLOCK_PROCESS_CPUTIME_ID) - cpu_start} #{switched}"
