# frozen_string_literal: true

require "spec_helper"
require "json"
require_relative "../support/sidekiq_client"
require_relative "../support/sidekiq_process"
require_relative "../support/backoff_jobs"

# on_conflict: :reschedule's backoff run by a real Sidekiq process on a private redis-server, while this
# process holds the jobs' lock: each reschedule is a push that carries its moment ("at") and its count,
# recorded by the Sidekiq process's client middleware as it is pushed; delays are read from those, never
# from sleeps.
RSpec.describe "on_conflict: :reschedule's backoff under a real Sidekiq", timeout: 90 do
  app = File.expand_path("../support/backoff_jobs.rb", __dir__)
  lock_prefix = "backoff:#{SecureRandom.hex(4)}:"

  before(:all) do
    @server = RedisServer.new.start
    @sidekiq = SidekiqProcess.new(app: app, env: { "REDIS_URL" => @server.url, "LOCK_PREFIX" => lock_prefix }).start
  end

  after(:all) do
    @sidekiq&.stop
    @server&.shutdown
  end

  include_context "a Sidekiq client of its own"

  before { use_locks(lock_prefix) }

  let(:lock_prefix) { lock_prefix }
  let(:run) { SecureRandom.hex(4) }
  let(:count) { LockManager::JobBackoff::COUNT }

  # Held by another owner for the example (a claim of its own token, as a job of another process holds one).
  def hold(run)
    LockManager.locker.claim(["backoff:#{run}"], ["the-spec"], [120])
  end

  def free(run)
    LockManager.locker.release_claim("backoff:#{run}", "the-spec")
  end

  def push(klass, run)
    Sidekiq::Client.push("class" => klass, "args" => [run])
  end

  def list(name)
    admin.lrange("#{lock_prefix}#{name}", 0, -1).map { |line| JSON.parse(line) }
  end

  # The reschedules of this run's jobs: { "jid", "at", "count", "delay" (at less the moment of the push) }.
  def pushes(klass)
    list("pushes").filter_map do |name, jid, args, *at_count_pushed_at|
      next unless name == klass && args == [run]

      at, carried, pushed_at = at_count_pushed_at
      { "jid" => jid, "at" => at, "count" => carried, "delay" => at - pushed_at }
    end
  end

  def runs(klass)
    list("ran").select { |name, ran_run, _| name == klass && ran_run == run }.map(&:last)
  end

  # The job `jid` in Sidekiq's retry set: its payload.
  def retrying(jid)
    admin.zrange("retry", 0, -1).map { |payload| JSON.parse(payload) }.find { |job| job["jid"] == jid }
  end

  # What Sidekiq's retry does when it is due, now: the payload goes back to its queue as it is.
  def retry_now(jid)
    payload = admin.zrange("retry", 0, -1).find { |json| JSON.parse(json)["jid"] == jid }
    admin.zrem("retry", payload)
    Sidekiq::Client.push(JSON.parse(payload))
  end

  it "grows the delay 1, 2, 4 s (+ up to 25%) as the count travels, then skips the job at max_reschedules" do
    hold(run)
    first = push("BackoffCurveJob", run)
    eventually(timeout: 40, interval: 0.05) { @sidekiq.log.include?("BackoffCurveJob jid=") && skipped_line(run) }

    again = pushes("BackoffCurveJob")
    expect(again.map { |push| push["count"] }).to eq([1, 2, 3])
    [1, 2, 4].zip(again).each do |base, push|
      expect(push["delay"]).to be_between(base - 0.25, base * 1.25) # the moment computed just before the push
    end
    expect(again.map { |push| push["jid"] }).not_to include(first) # each push is a new jid
    expect(skipped_line(run)).to include("jid=#{again.last["jid"]}", "after 3 reschedules (max_reschedules)")
    expect(@sidekiq.log.scan(/skipped BackoffCurveJob jid=\h+: lock "backoff:#{run}"/).size).to eq(1)
    expect(runs("BackoffCurveJob")).to eq([])
    expect(admin.zrange("retry", 0, -1).grep(/#{run}/)).to eq([])
  ensure
    free(run)
  end

  def skipped_line(run)
    @sidekiq.log.lines.find { |line| line.include?("skipped BackoffCurveJob") && line.include?("backoff:#{run}") }
  end

  it "runs a job once when it finds its lock free at last, its count ending there" do
    hold(run)
    push("BackoffCurveJob", run)
    eventually(timeout: 20, interval: 0.02) { pushes("BackoffCurveJob").size == 2 }
    free(run)
    eventually(timeout: 20, interval: 0.05) { runs("BackoffCurveJob").size == 1 }
    sleep 1.5 # a push or a run still coming would show now

    expect(runs("BackoffCurveJob")).to eq([pushes("BackoffCurveJob").last["jid"]])
    expect(pushes("BackoffCurveJob").map { |push| push["count"] }).to eq([1, 2])
  end

  it "asks the class's Proc with attempts 1, 2, 3, then raises LockNotAcquired into Sidekiq's retries, " \
     "whose retry that finds the lock held raises again at once, its count kept" do
    hold(run)
    push("BackoffProcJob", run)
    gave_up = eventually(timeout: 20, interval: 0.05) do
      last = pushes("BackoffProcJob").last
      last && retrying(last["jid"])
    end

    expect(list("attempts")).to eq([1, 2, 3])
    expect(pushes("BackoffProcJob").map { |push| [push["count"], push["delay"]] })
      .to match([[1, be_within(0.25).of(0.5)], [2, be_within(0.25).of(1.0)], [3, be_within(0.25).of(1.5)]])
    expect(gave_up).to include("error_class" => "LockManager::LockNotAcquired", count => 3, "retry_count" => 0)
    expect(gave_up["error_message"]).to include("backoff:#{run}")

    retry_now(gave_up["jid"])
    again = eventually(timeout: 20, interval: 0.05) do
      (job = retrying(gave_up["jid"])) && job["retry_count"] == 1 && job
    end
    expect(again).to include("error_class" => "LockManager::LockNotAcquired", count => 3)
    expect(list("attempts")).to eq([1, 2, 3]) # no fourth reschedule: Sidekiq's retries decide now
    expect(pushes("BackoffProcJob").size).to eq(3)
    expect(runs("BackoffProcJob")).to eq([])
  ensure
    admin.del("retry")
    free(run)
  end

  it "starts the count again for Sidekiq's retry of a job that ran and failed in its own code" do
    hold(run)
    push("BackoffFailingJob", run)
    eventually(timeout: 20, interval: 0.02) { pushes("BackoffFailingJob").size >= 2 }
    free(run)
    failed = eventually(timeout: 20, interval: 0.05) { (jid = runs("BackoffFailingJob").first) && retrying(jid) }
    # Sidekiq's retry carries the payload as the job started: its count too.
    expect(failed).to include("error_class" => "RuntimeError", count => be >= 2)

    hold(run)
    before = pushes("BackoffFailingJob").size
    retry_now(failed["jid"])
    eventually(timeout: 20, interval: 0.05) { pushes("BackoffFailingJob").size > before }

    expect(pushes("BackoffFailingJob")[before]["count"]).to eq(1)
    expect(runs("BackoffFailingJob").size).to eq(1)
  ensure
    admin.del("retry")
    free(run)
  end
end
