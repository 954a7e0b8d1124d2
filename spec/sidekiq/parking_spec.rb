# frozen_string_literal: true

require "spec_helper"
require "sidekiq/api"
require_relative "../support/sidekiq_process"
require_relative "../../demo/timeline"

# on_conflict: :park in a real Sidekiq process (spec/support/parked_jobs.rb, concurrency 5) on a
# private redis-server: jobs that find their lock held wait in Redis, and each release pushes the
# next. Every assertion reads what the jobs recorded, and Sidekiq's log.
RSpec.describe "Parked jobs (on_conflict: :park) under Sidekiq", timeout: 120 do
  app = File.expand_path("../support/parked_jobs.rb", __dir__)

  before(:all) do
    @server = RedisServer.new.start
    @timeline = "timeline:#{SecureRandom.hex(4)}"
    @env = { "REDIS_URL" => @server.url, "LOCK_PREFIX" => "park:", "TIMELINE_KEY" => @timeline }
    @sidekiq = [SidekiqProcess.new(app: app, env: @env).start] # the one running: an example may replace it
    Sidekiq.configure_client { |config| config.redis = { url: @server.url } }
    @pool = Sidekiq::RedisConnection.create(url: @server.url, size: 2)
  end

  after(:all) do
    @pool&.shutdown(&:close)
    @sidekiq&.each(&:stop)
    @server&.shutdown
  end

  around { |example| Sidekiq::Client.via(@pool) { example.run } }

  let(:admin) { @server.client }
  let(:locks) { LockManager::Locker.new(redis_url: @server.url, key_prefix: "park:") }

  after { admin.close }

  def push(klass, *args)
    Sidekiq::Client.push("class" => klass, "args" => args)
  end

  def events(klass)
    Timeline.read(admin, @timeline).select { |e| e["class"] == klass }
  end

  def finished(klass, event, args_first)
    events(klass).count { |e| e["event"] == event && e["args"].first == args_first }
  end

  def intervals(klass, event, args_first)
    Timeline.work_intervals(events(klass).select { |e| e["args"].first == args_first }, event).sort
  end

  # Lets a holder pushed with this gate's name as its seconds end its work (GatedWork).
  def open_gate(name)
    admin.set("#{@timeline}:gate:#{name}", "1")
  end

  def log_lines(pattern)
    @sidekiq.sum([]) { |process| process.log.lines.grep(pattern) }
  end

  it "runs 100 jobs parked behind a holder one at a time, each pushed by the release before it" do
    holder = push("ParkedWorker", "a", "a")
    eventually(timeout: 20) { events("ParkedWorker").any? { |e| e["jid"] == holder && e["event"] == "working" } }
    100.times { push("ParkedWorker", "a", 0.02) }
    eventually(timeout: 60, interval: 0.1) { locks.parked_count("parked:a") == 100 }
    open_gate("a")
    eventually(timeout: 90, interval: 0.1) { finished("ParkedWorker", "parked done", "a") == 101 }
    runs = intervals("ParkedWorker", "parked done", "a")
    gaps = runs.each_cons(2).map { |(_, released), (started, _)| started - released }

    expect(runs.size).to eq(101)
    expect(Timeline.most_at_once(runs)).to eq(1)
    expect(runs.first.first).to be < runs[1].first # the holder first
    expect(gaps.sort[gaps.size / 2]).to be < 0.1 # median: a release pushes the next job itself
    expect(gaps.max).to be < 2 # no job waits for a poll or its fallback, even on a busy machine
    expect(log_lines(/parked ParkedWorker jid=\h+: lock "parked:a" is held by jid=\h+ \(\d+ in line\)/).size).to eq(100)
    fallback = JSON.parse(LockManager::Sidekiq::Unpark.fallback("parked:a", "default"))["jid"]
    expect(log_lines(/rescheduled|Unpark jid=#{fallback}/)).to be_empty # nor did the fallback run
    expect(Sidekiq::ScheduledSet.new.size).to eq(0) # the fallback went with the last parked job
    expect(locks.parked_count("parked:a")).to eq(0)
  end

  it "loses no parked job when the holder's process is SIGKILLed: they run after its lock expires" do
    holder = push("ParkedWorker", "b", 60)
    eventually(timeout: 20) { events("ParkedWorker").any? { |e| e["jid"] == holder && e["event"] == "working" } }
    5.times { push("ParkedWorker", "b", 0.1) }
    eventually(timeout: 20) { locks.parked_count("parked:b") == 5 }
    @sidekiq.last.stop(:KILL)
    killed = Time.now.to_f
    @sidekiq << SidekiqProcess.new(app: app, env: @env).start
    restarted = Time.now.to_f
    eventually(timeout: 30, interval: 0.1) { finished("ParkedWorker", "parked done", "b") == 5 }
    runs = intervals("ParkedWorker", "parked done", "b")
    warn "kill to first parked run: #{(runs.first.first - killed).round(2)} s" if ENV["LM_FAULTS_TIMES"]

    expect(runs.size).to eq(5) # the holder's own run died with its process (Sidekiq's basic fetch)
    expect(Timeline.most_at_once(runs)).to eq(1)
    # The lock lived 3 s past its last renewal, its fallback was due 1 s later; a new Sidekiq's scheduler
    # first polls within 5 s of its start, then every 0.25-0.75 s; 3 s more for a loaded machine.
    expect(runs.first.first).to be < [killed + 3 + 1, restarted + 5].max + 0.75 + 3
    expect(log_lines(/class=LockManager::Sidekiq::Unpark/)).not_to be_empty
    expect(locks.parked_count("parked:b")).to eq(0)
  end

  it "parks at most park_limit jobs; the others are skipped, as when_full: :skip says" do
    holder = push("LimitedParkWorker", 0, "limited")
    eventually(timeout: 20) { events("LimitedParkWorker").any? { |e| e["jid"] == holder && e["event"] == "working" } }
    (1..4).each { |number| push("LimitedParkWorker", number, 0.05) }
    eventually(timeout: 30, interval: 0.1) { log_lines(/skipped LimitedParkWorker/).size == 2 }
    open_gate("limited")
    eventually(timeout: 30, interval: 0.1) do
      events("LimitedParkWorker").count { |e| e["event"] == "limited done" } == 3
    end
    sleep 1 # nothing else runs

    expect(events("LimitedParkWorker").count { |e| e["event"] == "limited done" }).to eq(3)
    skipped = /skipped LimitedParkWorker jid=\h+: lock "limited-park" .* \(2 parked: park_limit\)/
    expect(log_lines(skipped).size).to eq(2)
    expect(Timeline.most_at_once(Timeline.work_intervals(events("LimitedParkWorker"), "limited done"))).to eq(1)
  end

  {
    "ThrottledParkWorker" => ["jobs over a concurrency rule (throttle_with on_limit: :park)", "throttled done",
                              /parked ThrottledParkWorker jid=\h+: limiter "park-tenant" has no free place/,
                              "park-tenant"],
    "PlacesParkWorker" => ["jobs on a lock of two places (lock_with limit: 2, on_conflict: :park)", "places done",
                           /parked PlacesParkWorker jid=\h+: lock "park-places" is held \(\d+ in line\)/, "park-places"]
  }.each do |klass, (what, done, parked_line, key)|
    it "parks #{what}: each end hands its place to the next, two at once" do
      12.times { |number| push(klass, number, 0.3) }
      eventually(timeout: 60, interval: 0.1) { events(klass).count { |e| e["event"] == done } == 12 }
      runs = Timeline.work_intervals(events(klass), done).sort
      ends = runs.map(&:last).sort
      # Each start after the first two follows an end: how long after the latest end before it.
      waits = runs.drop(2).map { |started, _| started - ends.select { |ended| ended <= started + 0.005 }.max.to_f }

      expect(runs.size).to eq(12)
      expect(Timeline.most_at_once(runs)).to eq(2)
      expect(waits.sort[waits.size / 2]).to be < 0.1 # median: an end pushes the next parked job itself
      expect(log_lines(parked_line).size).to be >= 5
      expect(log_lines(/(throttled|rescheduled|not parked) #{klass}/)).to be_empty # nothing rescheduled
      expect(locks.parked_count(key)).to eq(0)
      expect(Sidekiq::ScheduledSet.new.size).to eq(0) # the fallback went with the last parked job
    end
  end

  it "parks the run lock of :until_and_while_executing: a duplicate pushed while one runs waits for it" do
    first = push("UniqueParkWorker", 7)
    eventually(timeout: 20) { events("UniqueParkWorker").any? { |e| e["jid"] == first && e["event"] == "working" } }
    second = push("UniqueParkWorker", 7)
    expect(second).not_to be_nil # the enqueue lock was released when the first started
    eventually(timeout: 30, interval: 0.1) { log_lines(/parked UniqueParkWorker jid=#{second}/).size == 1 }
    open_gate("unique-7")
    eventually(timeout: 30, interval: 0.1) { finished("UniqueParkWorker", "unique done", 7) == 2 }
    runs = intervals("UniqueParkWorker", "unique done", 7)

    expect(Timeline.most_at_once(runs)).to eq(1)
    expect(log_lines(/parked UniqueParkWorker jid=#{second}: lock "UniqueParkWorker:\h+:run" .* \(1 in line\)/).size)
      .to eq(1)
  end
end
