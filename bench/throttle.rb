# frozen_string_literal: true

# throttle_with under a real Sidekiq process (concurrency 5, bench/throttle_jobs.rb): JOBS (default
# 10) jobs pushed at once to a class with `throttle_with rate: 1, per: 1` (1 run a second), as many
# to one with `window: 1, per: 1`, to one with `sliding_window: 1, per: 1`, then to a class with the
# fixed-interval way (`lock_with :nonblocking, on_conflict: :reschedule, reschedule_in: 1`, each run
# holding the lock 1 s), one after the other.
#
#   bundle exec ruby bench/throttle.rb
#   POLL=0.1 bundle exec ruby bench/throttle.rb   # Sidekiq's poll_interval_average (default 0.5, as the specs)
#
#   lateness     for each refusal, when the job came back (its next refusal, or its perform's start)
#                less the "at" it was pushed again with (refusal time + retry_after, or +
#                reschedule_in and jitter): Sidekiq's scheduled-set poll and pickup. Target: median
#                <= 100 ms.
#   reschedules  pushes again per job refused at least once. Target 1 for throttle_with: each refused
#                job is promised its own moment (its units counted for it), so jobs refused together
#                come back one after the other, each admitted then. It can be more when a job comes
#                back later than its promise allows (a window that has ended; a sliding window's tenth
#                of a window). The fixed interval makes it about the number of jobs ahead of it.
# The pushes again are recorded by a client middleware in the server, the starts by the jobs
# (bench/throttle_jobs.rb). Always a throwaway redis-server of its own (not REDIS_URL).

require_relative "../spec/support/stack"
Stack.select! # first: SIDEKIQ puts the vendored libraries ahead of the stack's gems
Stack.check!
require "sidekiq"
require_relative "../spec/support/sidekiq_process"

require "json"
require "securerandom"
require_relative "support"

JOBS = Integer(ENV.fetch("JOBS", "10"))
POLL = Float(ENV.fetch("POLL", "0.5"))
LATENESS_TARGET = 0.1 # seconds, median
RESCHEDULES_TARGET = 1 # per refused job, median
RUN = SecureRandom.hex(4)
CLASSES = { "throttle_with rate: 1" => "ThrottledBenchJob",
            "throttle_with window: 1" => "WindowBenchJob",
            "throttle_with sliding_window: 1" => "SlidingBenchJob",
            "fixed interval (1 s)" => "FixedIntervalBenchJob" }.freeze

def records(list)
  ADMIN.lrange(list, 0, -1).map { |line| JSON.parse(line) }
end

def wait_for(what, timeout:)
  deadline = Bench.now + timeout
  sleep 0.1 until yield || Bench.now > deadline
  yield or raise "#{what}: not within #{timeout}s\n#{SIDEKIQ.log.lines.last(20).join}"
end

# One job scheduled in 0.2 s, run: the scheduled-set poller has started (it first waits up to 5 s).
def warm_up
  Sidekiq::Client.push("class" => "ThrottledBenchJob", "args" => ["warm-up", -1], "at" => Time.now.to_f + 0.2)
  wait_for("the warm-up job", timeout: 30) { records("bench:ran").any? }
  ADMIN.del("bench:ran", "bench:pushed")
end

# Pushes JOBS jobs of `klass` at once and waits until each has started.
# @return [Hash] per job number: its pushes again ([pushed at, at]) and its start
def measure(klass)
  JOBS.times { |number| Sidekiq::Client.push("class" => klass, "args" => [RUN, number]) }
  ran = -> { records("bench:ran").select { |record| record.first == klass } }
  wait_for("#{JOBS} #{klass} runs", timeout: 30 + (JOBS * 5)) { ran.call.size >= JOBS }
  pushed = records("bench:pushed").select { |record| record.first == klass }
  Array.new(JOBS) do |number|
    [pushed.select { |record| record[1] == number }.map { |record| record.last(2) }.sort,
     ran.call.find { |record| record[1] == number }.last]
  end
end

# Lateness of each push again: when the job came back (next push again, or its start) less its "at".
def lateness(jobs)
  jobs.flat_map do |pushes, started|
    pushes.each_with_index.map { |(_, at), i| (pushes[i + 1]&.first || started) - at }
  end
end

def summary(jobs)
  late = lateness(jobs)
  counts = jobs.map { |pushes, _| pushes.size }.reject(&:zero?)
  starts = jobs.map(&:last).sort
  { late: late, counts: counts, span: starts.last - starts.first,
    median_late: late.empty? ? nil : Bench.percentile(late, 0.5),
    median_count: counts.empty? ? 0 : Bench.percentile(counts, 0.5) }
end

def report(results)
  puts format("  %<kind>-32s %<refused>8s %<resched>13s %<total>6s %<late>17s %<max>9s %<span>14s",
              kind: "kind", refused: "refused", resched: "reschedules", total: "total", late: "lateness median",
              max: "max", span: "first-last run")
  puts format("  %<kind>-32s %<refused>8s %<resched>13s", kind: "", refused: "jobs", resched: "median / max")
  results.each do |kind, s|
    puts format("  %<kind>-32s %<refused>8s %<resched>13s %<total>6d %<late>17s %<max>9s %<span>12.1f s",
                kind: kind, refused: "#{s[:counts].size}/#{JOBS}", resched: "#{s[:median_count]} / #{s[:counts].max}",
                total: s[:counts].sum, late: Bench.ms(s[:median_late]), max: Bench.ms(s[:late].max), span: s[:span])
  end
end

Redis.silence_deprecations = true if Redis.respond_to?(:silence_deprecations=) # Sidekiq 6.4's calls
server = RedisServer.new(own_session: true).start
at_exit { server.shutdown }
ADMIN = Redis.new(url: server.url)
Sidekiq.configure_client { |config| config.redis = { url: server.url, size: 1 } }
SIDEKIQ = SidekiqProcess.new(app: File.expand_path("throttle_jobs.rb", __dir__),
                             env: { "REDIS_URL" => server.url, "POLL" => POLL.to_s })
at_exit do # runs before the server's shutdown (at_exit handlers run last first)
  SIDEKIQ.stop
rescue Errno::ESRCH, Errno::ECHILD
  nil
end
SIDEKIQ.start

Bench.header(server.url)
puts "sidekiq:      #{Sidekiq::VERSION}, 1 process, concurrency 5, poll_interval_average #{POLL} s " \
     "(polls every #{POLL / 2}-#{POLL * 1.5} s)", ""
warm_up
results = CLASSES.transform_values { |klass| summary(measure(klass)) }
puts "#{JOBS} jobs pushed at once to each class (lateness: came back - scheduled at, over every reschedule):"
report(results)
results.first(3).each do |kind, throttled|
  puts "", "#{kind}: median lateness #{Bench.ms(throttled[:median_late])}, wanted <= " \
           "#{Bench.ms(LATENESS_TARGET)}: #{Bench.verdict(throttled[:median_late] || 0, LATENESS_TARGET)}; " \
           "reschedules per refused job #{throttled[:median_count]} (median), wanted #{RESCHEDULES_TARGET}: " \
           "#{Bench.verdict(throttled[:median_count], RESCHEDULES_TARGET)}"
end
puts "fixed interval: reschedules per refused job #{results.values.last[:median_count]} (median)"
