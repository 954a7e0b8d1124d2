# frozen_string_literal: true

# What events cost a lock cycle. With nobody subscribed, a nonblocking_lock cycle must allocate no
# more objects than before events existed: the extension's own call plus 2 (the Result every cycle
# returns, and the environment of the block the extension yields to); ActiveSupport loaded with no
# listener must not change that. With a subscriber, the figures show what the events cost.
#
#   bundle exec ruby bench/events.rb
#
# Starts a throwaway redis-server on a free loopback port unless REDIS_URL is set.
# BENCH_SECONDS (default 2) is the measured time per workload.

require_relative "support"

CYCLES = 20_000
DURATION = Float(ENV.fetch("BENCH_SECONDS", "2"))

# @return [Float] objects allocated per call of the block, GC off
def allocations(cycles = CYCLES, &cycle)
  1000.times(&cycle)
  GC.disable
  before = GC.stat(:total_allocated_objects)
  cycles.times(&cycle)
  (GC.stat(:total_allocated_objects) - before).fdiv(cycles).round(2)
ensure
  GC.enable
end

# @return [Float] cycles per second
def rate(&cycle)
  count = 0
  deadline = Bench.now + DURATION
  while Bench.now < deadline
    100.times(&cycle)
    count += 100
  end
  count / DURATION
end

url = Bench.redis_url
Bench.header(url)
locker = LockManager::Locker.new(redis_url: url, pool_size: 1)
native = locker.instance_variable_get(:@native) # the floor: the extension's call, no Ruby layer
key = "bench:events:#{Process.pid}"
no_op = proc {}

floor = allocations { native.synchronize(key, 30_000, nil, 1, false, false, &no_op) }
quiet = allocations { locker.nonblocking_lock(key) {} }
quiet_rate = rate { locker.nonblocking_lock(key) {} }
require "active_support/notifications"
with_as = allocations { locker.nonblocking_lock(key) {} }
elsewhere = LockManager.subscribe("conflict.lock_manager") { |_event| nil } # jobs' events only
with_other = allocations { locker.nonblocking_lock(key) {} }
LockManager.unsubscribe(elsewhere)
subscriber = LockManager.subscribe { |_event| nil }
loud = allocations { locker.nonblocking_lock(key) {} }
loud_rate = rate { locker.nonblocking_lock(key) {} }
LockManager.unsubscribe(subscriber)
as_listener = ActiveSupport::Notifications.subscribe(/lock_manager/) { |*| nil }
with_as_listener = allocations { locker.nonblocking_lock(key) {} }
ActiveSupport::Notifications.unsubscribe(as_listener)

puts "", "objects allocated per nonblocking_lock cycle (#{CYCLES} cycles, GC off):"
puts format("  extension call alone (floor)            %<n>.2f", n: floor)
puts format("  no subscriber                           %<n>.2f  (floor + %<extra>.2f)",
            n: quiet, extra: quiet - floor)
puts format("  ActiveSupport loaded, no listener       %<n>.2f", n: with_as)
puts format("  a subscriber of conflict events only    %<n>.2f", n: with_other)
puts format("  one LockManager.subscribe block         %<n>.2f  (acquire and release events)", n: loud)
puts format("  one ActiveSupport::Notifications subscriber %<n>.2f", n: with_as_listener)
puts format("cycles/s: %<quiet>.0f with no subscriber, %<loud>.0f with one (%<ratio>.2fx)",
            quiet: quiet_rate, loud: loud_rate, ratio: loud_rate / quiet_rate)
puts format("no subscriber: %<n>.2f objects/cycle, %<extra>.2f beyond the extension's call " \
            "(target: 2, as before events): %<verdict>s",
            n: quiet, extra: quiet - floor, verdict: Bench.verdict(quiet - floor, 2.0))
puts format("ActiveSupport loaded, no listener: %<n>.2f (target: the same %<quiet>.2f): %<verdict>s",
            n: with_as, quiet: quiet, verdict: Bench.verdict(with_as, quiet))
puts format("a subscriber of other events only: %<n>.2f (target: the same %<quiet>.2f): %<verdict>s",
            n: with_other, quiet: quiet, verdict: Bench.verdict(with_other, quiet))
