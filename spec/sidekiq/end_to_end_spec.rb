# frozen_string_literal: true

require "spec_helper"
require "json"
require "sidekiq/api"
require_relative "../support/sidekiq_process"
require_relative "../../demo/timeline"

# A real Sidekiq process (sidekiq -r spec/support/sidekiq_jobs.rb, concurrency 5) on a private
# redis-server. Jobs are pushed by class name, as another service would; every assertion reads
# what the jobs recorded in Redis.
RSpec.describe "Sidekiq end to end" do
  app = File.expand_path("../support/sidekiq_jobs.rb", __dir__)

  before(:all) do
    @server = RedisServer.new.start
    @timeline = "timeline:#{SecureRandom.hex(4)}"
    @env = { "REDIS_URL" => @server.url, "LOCK_PREFIX" => "e2e:", "TIMELINE_KEY" => @timeline }
    @sidekiq = SidekiqProcess.new(app: app, env: @env).start
    # Pushes and Sidekiq's API go to this spec's server whatever another spec gave Sidekiq: 7 and 8
    # keep their first pool and follow Client.via; 6.4 replaces its pool here.
    Sidekiq.configure_client { |config| config.redis = { url: @server.url } }
    @pool = Sidekiq::RedisConnection.create(url: @server.url, size: 2)
  end

  after(:all) do
    @pool&.shutdown(&:close)
    @sidekiq&.stop
    @server&.shutdown
  end

  around { |example| Sidekiq::Client.via(@pool) { example.run } }

  let(:admin) { @server.client }
  let(:locks) { LockManager::Locker.new(redis_url: @server.url, key_prefix: "e2e:") }

  after { admin.close }

  def push(klass, *args, **extra)
    Sidekiq::Client.push({ "class" => klass, "args" => args }.merge(extra.transform_keys(&:to_s)))
  end

  def events(klass = nil)
    all = Timeline.read(admin, @timeline)
    klass ? all.select { |e| e["class"] == klass } : all
  end

  # Counts only the events the block accepts, when given: the timeline is shared by the group's examples.
  def wait_for_events(klass, event, count, timeout: 20, &only)
    eventually(timeout: timeout, interval: 0.05) do
      events(klass).count { |e| e["event"] == event && (only.nil? || only.call(e)) } >= count
    end
    events(klass)
  end

  def work_intervals(klass, finished)
    Timeline.work_intervals(events(klass), finished)
  end

  def most_at_once(intervals)
    Timeline.most_at_once(intervals)
  end

  it "the seed's story: 5 nonblocking jobs while the first works, exactly one result" do
    first = push("MyWorker", 1.5)
    eventually { events("MyWorker").any? { |e| e["jid"] == first && e["event"] == "working" } }
    4.times { push("MyWorker", 1.5) }
    list = wait_for_events("MyWorker", "done", 1)
    wait_for_events("MyWorker", "skipped", 4)

    expect(list.count { |e| e["event"] == "MyWorker result" }).to eq(1)
    expect(events("MyWorker").select { |e| e["event"] == "MyWorker result" }.map { |e| e["jid"] }).to eq([first])
    expect(events("MyWorker").count { |e| e["event"] == "skipped" }).to eq(4)
  end

  it "the seed's blocking story: 3 jobs, three results, one after another" do
    3.times { push("MyBlockingWorker", 0.5) }
    wait_for_events("MyBlockingWorker", "done", 3)
    intervals = work_intervals("MyBlockingWorker", /result/)

    expect(intervals.size).to eq(3)
    expect(most_at_once(intervals)).to eq(1)
  end

  it "locks around an ID: users 1 and 2 in parallel, the second job for user 1 skipped" do
    push("UserWorker", 1, 1.0)
    push("UserWorker", 2, 1.0)
    push("UserWorker", 1, 1.0)
    wait_for_events("UserWorker", "done", 2) { |e| [1, 2].include?(e["args"].first) }
    wait_for_events("UserWorker", "skipped", 1) { |e| e["args"].first == 1 }
    story = events("UserWorker").select { |e| [1, 2].include?(e["args"].first) }
    processed = story.select { |e| e["event"].end_with?("processed") }

    expect(processed.map { |e| e["event"] }.sort).to eq(["user 1 processed", "user 2 processed"])
    expect(story.select { |e| e["event"] == "skipped" }.map { |e| e["args"].first }).to eq([1])
    expect(most_at_once(work_intervals("UserWorker", /processed/))).to eq(2)
  end

  it ":reschedule runs the job later, once the lock is free" do
    holder = locks.try_lock("held-by-the-spec", timeout: 30)
    jid = push("RescheduleWorker")
    wait_for_events("RescheduleWorker", "skipped", 1)
    scheduled = Sidekiq::ScheduledSet.new.map { |entry| entry.item["class"] }

    expect(scheduled).to include("RescheduleWorker")
    expect(@sidekiq.log).to include("rescheduled RescheduleWorker jid=#{jid}")
    holder.release
    list = wait_for_events("RescheduleWorker", "rescheduled job ran", 1, timeout: 15)
    expect(list.find { |e| e["event"] == "rescheduled job ran" }["jid"]).not_to eq(jid)
  end

  it ":raise puts the job in the retry set with LockNotAcquired" do
    locks.try_lock("held-by-the-spec", timeout: 30)
    jid = push("RaiseWorker")
    retried = eventually { Sidekiq::RetrySet.new.find { |entry| entry.jid == jid } }

    expect(retried.item["error_class"]).to eq("LockManager::LockNotAcquired")
    expect(retried.item["error_message"]).to include("held-by-the-spec")
    expect(events("RaiseWorker").map { |e| e["event"] }).not_to include("raise job ran")
  ensure
    Sidekiq::RetrySet.new.clear
    admin.del("e2e:held-by-the-spec")
  end

  it "limit: 2 never lets a third job run at once" do
    6.times { |n| push("LimitedWorker", n) }
    wait_for_events("LimitedWorker", "done", 6)

    expect(most_at_once(work_intervals("LimitedWorker", /limited/))).to eq(2)
  end

  it "set(lock_manager: ...) at enqueue time overrides the class's key" do
    locks.try_lock("user:7", timeout: 30) # UserWorker's own key for user 7 is held...
    push("UserWorker", 7, 0.1, lock_manager: { "key" => "custom-key-7" }) # ...but this job locks elsewhere
    wait_for_events("UserWorker", "user 7 processed", 1)
  ensure
    admin.del("e2e:user:7")
  end

  it "leaves no lock behind when Sidekiq shuts down (TERM) while a job waits in :blocking" do
    sidekiq = SidekiqProcess.new(app: app, env: @env.merge("LOCK_PREFIX" => "term:"), shutdown_timeout: 1,
                                 queue: "shutdown").start
    push("LongBlockingWorker", 1, queue: "shutdown")
    wait_for_events("LongBlockingWorker", "working", 1)
    push("LongBlockingWorker", 2, queue: "shutdown")
    eventually { events("LongBlockingWorker").count { |e| e["event"] == "start" } == 2 }
    expect(admin.exists?("term:shutdown")).to be(true)

    stopping = elapsed { sidekiq.stop(:TERM) }
    expect(stopping).to be < 10
    expect(admin.exists?("term:shutdown")).to be(false)
    expect(held_keys(admin, "term:*")).to eq([])
  ensure
    sidekiq&.stop
  end
end
