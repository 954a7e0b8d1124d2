# frozen_string_literal: true

# Jobs that find their lock held, under a real Sidekiq process (concurrency 5, bench/conflict_jobs.rb):
# one job holds the lock HOLD seconds (default 2), and JOBS more (default 50) are pushed meanwhile, each
# working WORK seconds (default 0.02) once it has the lock; for each way of waiting, one after the other:
# `on_conflict: :park`, `:reschedule` at a fixed `reschedule_in: 1`, and `:reschedule` with its default
# backoff (1, 2, 4 ... s, each plus up to 25%); then the same load over a `throttle_with concurrency: 1`
# rule instead of a lock, with `on_limit: :park` and with its reschedule at a fixed 1 s.
#
#   bundle exec ruby bench/conflicts.rb
#   JOBS=100 POLL=0.1 bundle exec ruby bench/conflicts.rb
#   WAYS=park bundle exec ruby bench/conflicts.rb     # only the ways whose name includes "park"
#
#   redundant starts   per conflicting job, the starts of a job that did no work (found the lock held,
#                      parked or was rescheduled) beyond its first, plus the parked jobs' fallback runs
#                      (LockManager::Sidekiq::Unpark): what the waiting cost Sidekiq. Target for :park: 0.
#   reschedules        per conflicting job, the pushes the server made (recorded by a client middleware).
#   release to start   from one job's end of work to the next one's start of work (the lock's release,
#                      the hand-over, Sidekiq's fetch, the middlewares): median and p99. Target for :park:
#                      within 100 ms, since the release pushes the next job itself.
#   most at once       jobs working at the same time (must be 1).
# Always a throwaway redis-server of its own (not REDIS_URL).

require_relative "../spec/support/stack"
Stack.select! # first: SIDEKIQ puts the vendored libraries ahead of the stack's gems
Stack.check!
require "sidekiq"
require_relative "../spec/support/sidekiq_process"

require "json"
require "securerandom"
require_relative "support"

JOBS = Integer(ENV.fetch("JOBS", "50"))
POLL = Float(ENV.fetch("POLL", "0.5"))
HANDOVER_TARGET = 0.1 # seconds, release to the next start, p99 for :park
RUN = SecureRandom.hex(4)
WAYS = { "on_conflict: :park" => "ParkBenchJob", "reschedule_in: 1 (fixed)" => "FixedBenchJob",
         "reschedule, default backoff" => "BackoffBenchJob", "throttle, on_limit: :park" => "ThrottleParkBenchJob",
         "throttle, reschedule_in: 1" => "ThrottleFixedBenchJob" }.freeze
CHOSEN = ENV.fetch("WAYS", "").split(",")
CLASSES = WAYS.select { |way, _| CHOSEN.empty? || CHOSEN.any? { |part| way.include?(part) } }

def records(list)
  ADMIN.lrange(list, 0, -1).map { |line| JSON.parse(line) }
end

def wait_for(what, timeout:)
  deadline = Bench.now + timeout
  sleep 0.05 until yield || Bench.now > deadline
  yield or raise "#{what}: not within #{timeout}s\n#{SIDEKIQ.log.lines.last(20).join}"
end

# The holder (job 0) first; once it works, JOBS more.
def measure(klass)
  Sidekiq::Client.push("class" => klass, "args" => [RUN, 0])
  wait_for("#{klass}'s holder", timeout: 30) { records("bench:started").any? { |r| r[0] == klass } }
  sleep 0.2
  (1..JOBS).each { |number| Sidekiq::Client.push("class" => klass, "args" => [RUN, number]) }
  worked = -> { records("bench:worked").select { |record| record[0] == klass } }
  wait_for("#{JOBS + 1} #{klass} runs", timeout: 60 + (JOBS * 5)) { worked.call.size > JOBS }
  summary(klass, worked.call)
end

def summary(klass, worked)
  intervals = worked.map { |_, _, from, to| [from, to] }.sort
  gaps = intervals.each_cons(2).map { |(_, done), (from, _)| from - done }
  starts = records("bench:started")
  own = starts.count { |record| record[0] == klass } - (JOBS + 1)
  fallback = starts.count { |record| record[0] == "LockManager::Sidekiq::Unpark" }
  ADMIN.del("bench:started") # the fallback's runs are counted once, for this class
  { redundant: (own - JOBS + fallback).fdiv(JOBS), fallback: fallback,
    reschedules: records("bench:pushed").count { |record| record[0] == klass }.fdiv(JOBS),
    median: Bench.percentile(gaps, 0.5), p99: Bench.percentile(gaps, 0.99), most: most_at_once(intervals),
    span: intervals.last.last - intervals.first.first }
end

def most_at_once(intervals)
  steps = intervals.flat_map { |from, to| [[from, 1], [to, -1]] }.sort
  steps.reduce([0, 0]) { |(now, most), (_, step)| [now + step, [most, now + step].max] }.last
end

COLUMNS = "  %<way>-26s %<redundant>10s %<fallback>9s %<reschedules>12s %<latency>18s %<most>8s %<span>11s"

def report(results)
  puts format(COLUMNS, way: "way", redundant: "redundant", fallback: "fallback", reschedules: "reschedules",
                       latency: "release->start", most: "at once", span: "first-last")
  puts format(COLUMNS, way: "", redundant: "starts/job", fallback: "runs", reschedules: "per job",
                       latency: "median / p99", most: "", span: "")
  results.each do |way, s|
    puts format(COLUMNS, way: way, redundant: format("%.2f", s[:redundant]), fallback: s[:fallback],
                         reschedules: format("%.2f", s[:reschedules]),
                         latency: "#{Bench.ms(s[:median])} / #{Bench.ms(s[:p99])}", most: s[:most],
                         span: format("%.1f s", s[:span]))
  end
end

Redis.silence_deprecations = true if Redis.respond_to?(:silence_deprecations=) # Sidekiq 6.4's calls
server = RedisServer.new(own_session: true).start
at_exit { server.shutdown }
ADMIN = Redis.new(url: server.url)
Sidekiq.configure_client { |config| config.redis = { url: server.url, size: 1 } }
SIDEKIQ = SidekiqProcess.new(app: File.expand_path("conflict_jobs.rb", __dir__),
                             env: { "REDIS_URL" => server.url, "POLL" => POLL.to_s })
at_exit do # runs before the server's shutdown (at_exit handlers run last first)
  SIDEKIQ.stop
rescue Errno::ESRCH, Errno::ECHILD
  nil
end
SIDEKIQ.start

Bench.header(server.url)
puts "sidekiq:      #{Sidekiq::VERSION}, 1 process, concurrency 5, poll_interval_average #{POLL} s", ""
results = CLASSES.transform_values { |klass| measure(klass) }
puts "1 holder (#{ENV.fetch("HOLD", "2")} s) and #{JOBS} conflicting jobs " \
     "(#{ENV.fetch("WORK", "0.02")} s of work each):"
report(results)
results.each do |way, park|
  next unless way.end_with?(":park")

  puts "", "#{way}: redundant starts per job #{format("%.2f", park[:redundant])}, wanted 0: " \
           "#{Bench.verdict(park[:redundant], 0)}; release to start p99 #{Bench.ms(park[:p99])}, wanted <= " \
           "#{Bench.ms(HANDOVER_TARGET)}: #{Bench.verdict(park[:p99], HANDOVER_TARGET)}"
end
