# frozen_string_literal: true

# bench/instructions.rb's worker, run under callgrind: `ruby -I LIB bench/instructions_worker.rb URL
# WORKLOAD COUNT` makes COUNT operations of WORKLOAD after one of warm-up (connecting, loading the
# scripts), and nothing else that depends on COUNT, so that two runs' difference is COUNT operations.
#
#   uncontended   nonblocking_lock with an empty block, one thread, one key
#   handoff       two threads taking turns at one key with blocking_lock (every cycle a hand-off)
#   plain_push    Sidekiq perform_async of a job with no lock_with (the gem's middleware installed)
#   unique_push   perform_async of a lock_with :until_executed job, each push accepted (fresh args)

url, workload, count = ARGV
count = Integer(count)
require "lock_manager"

case workload
when "uncontended", "handoff"
  locker = LockManager::Locker.new(redis_url: url, key_prefix: "bench:ir:")
  locker.nonblocking_lock("warm") {}
  if workload == "uncontended"
    count.times { locker.nonblocking_lock("k") {} }
  else
    turns = Array.new(2) { Thread.new { (count / 2).times { locker.blocking_lock("h", timeout: 10) { sleep 0 } } } }
    turns.each(&:join)
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

  count.times { |i| job.perform_async(i, run) || raise("push #{i} was refused") }
else
  abort "unknown workload #{workload.inspect}"
end
