# frozen_string_literal: true

# The seed article's two stories, played with threads against a real Redis:
#   1. five callers of nonblocking_lock("MyWorker") while the first one works: exactly one runs;
#   2. three callers of blocking_lock("MyWorker"): all run, one after another.
# Prints a timeline and one verdict per story; exits 0 only if both behaved.

require_relative "../lib/lock_manager"
require_relative "../spec/support/redis_server"

WORK_SECONDS = 1.5 # the seed's `sleep 5`, shortened

url = ENV.fetch("REDIS_URL") do
  server = RedisServer.new.start
  at_exit { server.shutdown }
  server.url
end
LockManager.configure do |c|
  c.redis_url = url
  c.key_prefix = "lock_manager_demo:#{Process.pid}:"
end

START = Process.clock_gettime(Process::CLOCK_MONOTONIC)
TIMELINE = Queue.new

def log(job, event)
  seconds = Process.clock_gettime(Process::CLOCK_MONOTONIC) - START
  TIMELINE << [seconds, job, event]
  puts format("  %<seconds>7.3fs  job %<job>d  %<event>s", seconds: seconds, job: job, event: event)
end

# Starts `count` jobs 0.1 s apart, as five quick `perform_async` calls would.
def run_jobs(count)
  Array.new(count) do |job|
    sleep 0.1
    Thread.new { yield job + 1 }
  end.each(&:join)
end

def verdict(passed, text)
  puts "  #{passed ? "PASS" : "FAIL"}: #{text}", ""
  passed
end

puts "lock_manager #{LockManager::VERSION} on #{LockManager.config.redis_url}", ""

puts "Story 1: 5 jobs call nonblocking_lock(\"MyWorker\") while the first works for #{WORK_SECONDS}s"
results = Queue.new
run_jobs(5) do |job|
  log(job, "start")
  result = LockManager::Locker.nonblocking_lock("MyWorker", timeout: 30) do
    sleep WORK_SECONDS
    log(job, "MyWorker result")
    job
  end
  log(job, result.run? ? "done" : "skipped (lock held), done")
  results << result
end
ran = Array.new(results.size) { results.pop }.select(&:run?)
story1 = verdict(ran.map(&:result) == [1], "exactly one job ran (job #{ran.map(&:result).join(", ")}), four skipped")

puts "Story 2: 3 jobs call blocking_lock(\"MyWorker\"), each working #{WORK_SECONDS}s"
TIMELINE.clear
run_jobs(3) do |job|
  log(job, "start")
  LockManager::Locker.blocking_lock("MyWorker", timeout: 30) do
    log(job, "got the lock")
    sleep WORK_SECONDS
    log(job, "MyWorker result")
  end
  log(job, "done")
end
events = Array.new(TIMELINE.size) { TIMELINE.pop }
held = events.select { |_, _, e| ["got the lock", "MyWorker result"].include?(e) }.sort_by(&:first)
one_at_a_time = held.each_slice(2).all? do |(_, a, e1), (_, b, e2)|
  a == b && e1 == "got the lock" && e2 == "MyWorker result"
end
story2 = verdict(held.size == 6 && one_at_a_time, "all three ran, one after another, never overlapping")

exit(story1 && story2 ? 0 : 1)
