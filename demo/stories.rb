# frozen_string_literal: true

# bin/demo: boots a real Sidekiq process (sidekiq -r demo/jobs.rb, concurrency 5) and replays the
# seed's stories against it, reading back what the jobs recorded in Redis:
#   1. five MyWorker (nonblocking) jobs while the first works: exactly one "MyWorker result";
#   2. three MyBlockingWorker jobs: three results, one after another;
#   3. UserWorker for users 1, 2, 1: users 1 and 2 in parallel, the second job for user 1 skipped;
#   4. ReportJob (lock_with :until_executed) pushed 5 times: 1 accepted and run, 4 refused at push;
#      pushed again once it finished: accepted and run;
#   5. ExportJob (throttle_with sliding_window: 2, per: 2) pushed 3 times: 2 run at once, the third is
#      pushed back (same jid, no retry) and runs once the rule admits it, 2 s after the first.
# Prints a timeline and one verdict per story; exits 0 only if every story behaved.
# On the stack's own Sidekiq, or the vendored one SIDEKIQ names (spec/support/stack.rb), here and in the
# sidekiq process it boots.

require_relative "../spec/support/stack"
Stack.select! # first: SIDEKIQ puts the vendored libraries ahead of the stack's gems
Stack.check!
require_relative "../spec/support/sidekiq_process"

require "redis"
require "securerandom"
require "sidekiq/api"
require_relative "../lib/lock_manager/worker"
require_relative "../spec/support/redis_server"
require_relative "timeline"

Redis.silence_deprecations = true if Redis.respond_to?(:silence_deprecations=) # 4.8 warns of Sidekiq 6.4's calls
$stdout.sync = true

def start_redis
  return ENV.fetch("REDIS_URL") if ENV.key?("REDIS_URL")

  server = RedisServer.new.start
  at_exit { server.shutdown }
  server.url
end

url = start_redis
run_id = SecureRandom.hex(4)
TIMELINE = "lock_manager_demo:#{run_id}:timeline".freeze
env = { "REDIS_URL" => url, "LOCK_PREFIX" => "lock_manager_demo:#{run_id}:", "TIMELINE_KEY" => TIMELINE }
ENV.update(env)
require_relative "jobs" # this process pushes ReportJob: its lock is taken at push
Sidekiq.configure_client { |config| config.redis = { url: url } }
Sidekiq.logger.level = Logger::WARN # this process only pushes: no INFO of its own (7 logs its Redis pool)
REDIS = Redis.new(url: url)

print "Booting Sidekiq #{Sidekiq::VERSION} (concurrency 5) against #{LockManager::Arguments.redact(url)}... "
SIDEKIQ = SidekiqProcess.new(app: File.expand_path("jobs.rb", __dir__), env: env).start
at_exit { SIDEKIQ.stop }
puts "ready", ""

def push(klass, *args)
  Sidekiq::Client.push("class" => klass, "args" => args)
end

def events_of(jids)
  Timeline.read(REDIS, TIMELINE).select { |e| jids.include?(e["jid"]) }
end

# Waits (30 s at most) until each job has finished, done or skipped.
def wait_for(jids)
  deadline = Time.now + 30
  sleep 0.1 until finished?(jids) || Time.now > deadline
end

def finished?(jids)
  events_of(jids).count { |e| %w[done skipped].include?(e["event"]) } == jids.size
end

# Prints the story's timeline once its jobs have finished; returns their events.
def play(title, started, jids)
  wait_for(jids)
  puts title
  events_of(jids).each { |e| print_event(e, started) }
  events_of(jids)
end

def print_event(entry, started)
  event = entry["event"] == "working" ? "got the lock, working" : entry["event"]
  label = "#{entry["class"]}(#{entry["args"].join(", ")}) #{entry["jid"][0, 6]}"
  puts format("  %<at>6.2fs  %<label>-34s %<event>s", at: entry["at"] - started, label: label, event: event)
end

def verdict(passed, text)
  puts "  #{passed ? "PASS" : "FAIL"}: #{text}", ""
  passed
end

verdicts = []

started = Time.now.to_f
jids = [push("MyWorker", 1.5)]
sleep 0.1 until events_of(jids).any? { |e| e["event"] == "working" }
4.times do
  sleep 0.1
  jids << push("MyWorker", 1.5)
end
events = play("Story 1: five MyWorker jobs (lock_with :nonblocking) while the first works 1.5 s", started, jids)
results = events.count { |e| e["event"] == "MyWorker result" }
skipped = events.count { |e| e["event"] == "skipped" }
verdicts << verdict(results == 1 && skipped == 4, "#{results} MyWorker result, #{skipped} skipped (want 1 and 4)")

started = Time.now.to_f
jids = Array.new(3) { push("MyBlockingWorker", 1.5) }
events = play("Story 2: three MyBlockingWorker jobs (lock_with :blocking, key: \"MyWorker\")", started, jids)
intervals = Timeline.work_intervals(events, /result/)
at_once = Timeline.most_at_once(intervals)
verdicts << verdict(intervals.size == 3 && at_once == 1,
                    "#{intervals.size} results, at most #{at_once} running at once (want 3 and 1)")

started = Time.now.to_f
jids = [push("UserWorker", 1, 1.5), push("UserWorker", 2, 1.5), push("UserWorker", 1, 1.5)]
events = play("Story 3: UserWorker for users 1, 2, 1 (lock_with key: ->(user_id, *) { \"user:\#{user_id}\" })",
              started, jids)
processed = events.select { |e| e["event"].end_with?("processed") }.map { |e| e["args"].first }.sort
skipped = events.select { |e| e["event"] == "skipped" }.map { |e| e["args"].first }
parallel = Timeline.most_at_once(Timeline.work_intervals(events, /processed/))
verdicts << verdict(processed == [1, 2] && skipped == [1] && parallel == 2,
                    "users #{processed.join(" and ")} processed #{parallel == 2 ? "in parallel" : "one by one"}, " \
                    "skipped: user #{skipped.join(", ")} (want 1 and 2 in parallel, user 1 skipped)")

started = Time.now.to_f
pushes = Array.new(5) { ReportJob.perform_async(7) }
accepted = pushes.compact
events = play("Story 4: ReportJob(7) pushed 5 times (lock_with :until_executed, unique_for: 60)", started, accepted)
ran = events.count { |e| e["event"] == "report 7 sent" }
puts "  pushes returned: #{pushes.map { |jid| jid ? jid[0, 6] : "nil (refused)" }.join(", ")}"
again = [ReportJob.perform_async(7)].compact
events = play("  ...and once it finished, pushed again", started, again)
ran_again = events.count { |e| e["event"] == "report 7 sent" }
verdicts << verdict(accepted.size == 1 && ran == 1 && ran_again == 1,
                    "#{accepted.size} accepted and #{ran} run, #{pushes.count(nil)} refused; the push after it " \
                    "#{ran_again == 1 ? "ran" : "did not run"} (want 1, 1, 4, ran)")

started = Time.now.to_f
jids = Array.new(3) { push("ExportJob", 7) }
deadline = Time.now + 30
sleep 0.1 until events_of(jids).count { |e| e["event"] == "export 7 sent" } == 3 || Time.now > deadline
puts "Story 5: ExportJob(7) pushed 3 times (throttle_with sliding_window: 2, per: 2)"
events = events_of(jids)
shown = { "skipped" => "throttled: pushed back", "working" => "admitted, working" }
events.each { |e| print_event(e.merge("event" => shown.fetch(e["event"], e["event"])), started) }
sent = events.select { |e| e["event"] == "export 7 sent" }
first_two, last = sent.map { |e| e["at"] - started }.sort.then { |times| [times.first(2), times[2]] }
pushed_back = events.count { |e| e["event"] == "skipped" }
retried = Sidekiq::RetrySet.new.size + Sidekiq::DeadSet.new.size
verdicts << verdict(sent.size == 3 && pushed_back == 1 && last.to_f - first_two.max.to_f >= 1.5 && retried.zero?,
                    "#{sent.size} sent, #{pushed_back} pushed back and run #{format("%.1f", last.to_f)}s in, " \
                    "#{retried} retried (want 3, 1 after 2 s, 0)")

puts verdicts.all? ? "All stories behaved." : "Some stories misbehaved."
exit(verdicts.all? ? 0 : 1)
