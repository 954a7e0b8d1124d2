# frozen_string_literal: true

# bench/instructions.rb's worker, run under callgrind: `ruby -I LIB bench/instructions_worker.rb URL
# WORKLOAD COUNT` makes COUNT operations of WORKLOAD after one of warm-up (connecting, loading the
# scripts), and nothing else that depends on COUNT, so that two runs' difference is COUNT operations.
# The operations run with the garbage collector stopped (after a full collection): when a collection
# falls depends on the heap as the process loaded it (its paths, its environment), and one costs
# 5-10 million instructions, 2,500-5,000 per cycle of 2,000. The objects they allocate are printed
# ("allocated N") for bench/instructions.rb to count instead.
#
#   uncontended   nonblocking_lock with an empty block, one thread, one key
#   handoff       two threads taking turns at one key with blocking_lock (every cycle a hand-off)
#   plain_push    Sidekiq perform_async of a job with no lock_with (the gem's middleware installed)
#   unique_push   perform_async of a lock_with :until_executed job, each push accepted (fresh args)

url, workload, count = ARGV
count = Integer(count)
require "lock_manager"

# Runs the counted operations with the collector stopped, and prints the objects they allocated.
def counted
  GC.start
  GC.disable
  before = GC.stat(:total_allocated_objects)
  yield
  allocated = GC.stat(:total_allocated_objects) - before
  puts "allocated #{allocated}"
end

case workload
when "uncontended", "handoff"
  locker = LockManager::Locker.new(redis_url: url, key_prefix: "bench:ir:")
  locker.nonblocking_lock("warm") {}
  if workload == "uncontended"
    counted { count.times { locker.nonblocking_lock("k") {} } }
  else
    counted do
      turns = Array.new(2) { Thread.new { (count / 2).times { locker.blocking_lock("h", timeout: 10) { sleep 0 } } } }
      turns.each(&:join)
    end
  end
when "plain_push", "unique_push"
  require "sidekiq"
  require "lock_manager/worker"
  LockManager.configure { |config| config.redis_url = url }
  Sidekiq.configure_client { |config| config.redis = { url: url, size: 1 } }

  require_relative "job_classes"

  job = workload == "plain_push" ? PlainJob : UniqueJob
  run = Process.pid # fresh arguments in every run, on a Redis that keeps the last run's locks
  raise "the warm-up push was refused" unless job.perform_async(-1, run)

  counted { count.times { |i| job.perform_async(i, run) || raise("push #{i} was refused") } }
else
  abort "unknown workload #{workload.inspect}"
end
