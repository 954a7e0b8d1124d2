# frozen_string_literal: true

require "spec_helper"
require "json"
require "uri"
require "lock_manager/admin"
require_relative "../support/parking"
require_relative "../support/process_helpers"

# LockManager::Admin's view of parked jobs (on_conflict: :park) against the suite's Redis: jobs parked through
# the real park path (Locker#park, as the Sidekiq middleware parks them) while another token holds the lock;
# their count read with the lock, their listing in line order, a delete, and the force-release that hands the
# lock to the first of them. Each example has its own queue and schedule keys, beside its own key prefix.
RSpec.describe "LockManager::Admin's parked jobs" do
  include Parking

  let(:locker) { new_locker }
  let(:admin) { LockManager::Admin.new(locker) }
  let(:queue) { parked_queue }

  it "counts a lock's parked jobs in the read of its holders and waiters: #lock, #locks and #each_lock" do
    hold_for_job("report:1")
    hold_for_job("report:2")
    expect(%w[a b c].map { |jid| park_job("report:1", jid) }).to eq([[:parked, 1], [:parked, 2], [:parked, 3]])

    expect(admin.lock("report:1")).to have_attributes(key: "report:1", parked: 3, waiters: [])
    expect(admin.lock("report:1").holders.map(&:jid)).to eq(["holder-report:1"])
    expect(admin.locks("report:*").map { |lock| [lock.key, lock.parked] }).to eq([["report:1", 3], ["report:2", 0]])
    expect(admin.each_lock("report:*").map { |lock| [lock.key, lock.parked] }.sort)
      .to eq([["report:1", 3], ["report:2", 0]])
  end

  it "reads the count in the same pipeline as the lock, and lists the line with one LRANGE" do
    hold_for_job("read")
    park_job("read", "a")
    admin.lock("warm") # Admin's connection opens before MONITOR starts
    monitor = ProcessHelpers::Monitor.new(URI(redis_url).port)
    admin.lock("read")
    admin.parked("read")
    commands = monitor.stop.map { |_, command| command[/\A"(\w+)"/, 1] }.grep_v(/\A(PING|UNSUBSCRIBE|PUNSUBSCRIBE)\z/)

    expect(commands).to eq(%w[TIME GET PTTL ZRANGE LLEN LRANGE])
  end

  it "lists the parked jobs first in line first: place, jid, class, args, queue and when each parked" do
    hold_for_job("line")
    park_job("line", "j1", payload: sidekiq_job("j1", args: ["<b>x</b>", { "n" => 1 }]))
    park_job("line", "j2")
    wrapped = sidekiq_job("j3", klass: "ActiveJob::QueueAdapters::SidekiqAdapter::JobWrapper",
                                args: [{ "job_class" => "ExportJob", "job_id" => "aj-1", "arguments" => [7, "csv"] }])
    park_job("line", "j3", payload: wrapped.merge("wrapped" => "ExportJob", "enqueued_at" => 1_760_000_002_500))

    jobs = admin.parked("line")

    expect(jobs.map(&:to_h)).to eq(
      [{ place: 1, jid: "j1", job_class: "ReportJob", args: ["<b>x</b>", { "n" => 1 }], queue: queue,
         enqueued_at: Time.at(1_760_000_001.25) },
       { place: 2, jid: "j2", job_class: "ReportJob", args: ["j2", 1], queue: queue,
         enqueued_at: Time.at(1_760_000_001.25) },
       # A wrapped ActiveJob: its own class and arguments; Sidekiq 8's enqueued_at in ms.
       { place: 3, jid: "j3", job_class: "ExportJob", args: [7, "csv"], queue: queue,
         enqueued_at: Time.at(1_760_000_002, 500, :millisecond) }]
    )
    expect(admin.parked("line", limit: 2).map(&:jid)).to eq(%w[j1 j2])
    expect(admin.parked("nothing")).to eq([])
    expect(admin.lock("nothing")).to be_nil
  end

  it "reads the job of Sidekiq's own push on this Sidekiq" do
    require "sidekiq"
    require "lock_manager/sidekiq"
    hold_for_job("sidekiq")
    payload = { "class" => "ReportJob", "args" => [42, "pdf"], "queue" => queue, "jid" => "abc123", "retry" => true,
                "created_at" => Time.now.to_f }
    pool = Sidekiq::RedisConnection.create(url: redis_url, size: 1) # never used: the commands are recorded
    commands = Sidekiq::Client.via(pool) { LockManager::Sidekiq::OnePush.commands(Sidekiq::Client.new, payload) }
    pool.shutdown(&:close)
    before = Time.now
    park_job("sidekiq", "abc123", push: commands)

    job = admin.parked("sidekiq").first

    expect(job).to have_attributes(place: 1, jid: "abc123", job_class: "ReportJob", args: [42, "pdf"], queue: queue)
    expect(job.enqueued_at).to be_within(5).of(before)
  end

  it "gives a parked job whose push is no job of Sidekiq's by its jid alone, and bytes not UTF-8 as U+FFFD" do
    hold_for_job("odd")
    park_job("odd", "raw", push: [["LPUSH", "queue:#{queue}", "not json"]])
    park_job("odd", "set", push: [["SADD", "queues", queue]])
    park_job("odd", "bytes", push: [["LPUSH", "queue:#{queue}", %({"class":"Bad\xFFJob","args":[1]}).b]])

    expect(admin.parked("odd").map(&:to_h)).to eq(
      [{ place: 1, jid: "raw", job_class: nil, args: nil, queue: nil, enqueued_at: nil },
       { place: 2, jid: "set", job_class: nil, args: nil, queue: nil, enqueued_at: nil },
       { place: 3, jid: "bytes", job_class: "Bad\uFFFDJob", args: [1], queue: nil, enqueued_at: nil }]
    )
  end

  it "deletes exactly the job named: the others move up, the lock and its holder are untouched" do
    holder = hold_for_job("del")
    %w[a b c].each { |jid| park_job("del", jid) }
    ttl = redis.pttl("#{prefix}del")

    expect(admin.delete_parked("del", "b")).to be(true)
    expect(admin.parked("del").map { |job| [job.place, job.jid] }).to eq([[1, "a"], [2, "c"]])
    expect(admin.delete_parked("del", "b")).to be(false) # gone already
    expect(admin.delete_parked("other", "a")).to be(false) # parked on another lock
    expect(admin.delete_parked("del", "a")).to be(true) # the first in line
    expect(admin.parked("del").map(&:jid)).to eq(%w[c])

    expect(admin.lock("del")).to have_attributes(parked: 1)
    expect(admin.lock("del").holders.map(&:jid)).to eq([holder])
    expect(redis.pttl("#{prefix}del")).to be_between(ttl - 5000, ttl)
    expect(pushed_jids).to eq([]) # nothing was pushed
    expect(admin.release("del")).to be(true) # the line still moves: c is next
    expect(admin.lock("del").holders.map(&:jid)).to eq(["c"])
  end

  it "force-releases a lock to its first parked job: the lock is that job's, and it is pushed to its queue" do
    hold_for_job("hand")
    %w[first second third].each { |jid| park_job("hand", jid) }

    expect(admin.release("hand")).to be(true)

    lock = admin.lock("hand")
    expect(lock.holders.map(&:jid)).to eq(["first"])
    expect(lock.holders.first.ttl).to be_between(20, 30) # handed over for the TTL it parked with
    expect(lock.parked).to eq(2)
    expect(pushed_jids).to eq(["first"])
    expect(JSON.parse(redis.lrange("queue:#{queue}", 0, -1).first)).to eq(sidekiq_job("first"))
    expect(redis.smembers("queues")).to include(queue)
    expect(admin.parked("hand").map { |job| [job.place, job.jid] }).to eq([[1, "second"], [2, "third"]])

    expect(admin.release("hand")).to be(true)
    expect(admin.lock("hand").holders.map(&:jid)).to eq(["second"])
    expect(pushed_jids).to eq(%w[second first]) # LPUSH: Sidekiq takes from the right
  end

  it "shows a lock that expired with jobs parked on it, and its release hands it to the first of them" do
    hold_for_job("expired", seconds: 0.5)
    %w[a b].each { |jid| park_job("expired", jid) }
    eventually { redis.exists("#{prefix}expired").zero? } # the holder died: no release came

    expect(admin.lock("expired")).to have_attributes(holders: [], waiters: [], parked: 2)
    expect(admin.locks("expired").map(&:key)).to eq([]) # SCAN finds locks by their own key only

    expect(admin.release("expired")).to be(true)
    expect(admin.lock("expired").holders.map(&:jid)).to eq(["a"])
    expect(pushed_jids).to eq(["a"])
    expect(admin.release("gone")).to be(false) # neither held nor parked on: nothing done
  end

  it "refuses bad arguments before anything reaches Redis" do
    closed = LockManager::Admin.new(LockManager::Locker.new(redis_url: closed_url, key_prefix: prefix))

    [[-> { closed.parked(nil) }, /key must be a String or Symbol, got nil/],
     [-> { closed.parked("") }, /key must not be empty/],
     [-> { closed.parked("k", limit: 0) }, /limit must be an Integer from 1/],
     [-> { closed.parked("k", limit: "5") }, /limit must be an Integer from 1 .*"5"/],
     [-> { closed.parked("k", limit: nil) }, /limit must be an Integer from 1 .*nil/],
     [-> { closed.delete_parked(nil, "jid") }, /key must be a String or Symbol/],
     [-> { closed.delete_parked("k", nil) }, /jid must be a String or Symbol, got nil/],
     [-> { closed.delete_parked("k", "") }, /jid must not be empty/],
     [-> { closed.delete_parked("k", 42) }, /jid must be a String or Symbol, got 42/]].each do |call, message|
      expect(&call).to raise_error(ArgumentError, message)
    end
    expect { closed.parked("k") }.to raise_error(LockManager::ConnectionError)
    expect { closed.delete_parked("k", "jid") }.to raise_error(LockManager::ConnectionError)
  end
end
