# frozen_string_literal: true

require "spec_helper"
require "json"
require "logger"
require "stringio"
require_relative "../support/sidekiq_client"
require_relative "../support/clearable_job_helpers"

# Sidekiq's API removes pending jobs in bulk (Queue#clear, ScheduledSet, RetrySet and DeadSet#clear) or
# sends them to the dead set (SortedEntry#kill, RetrySet#kill_all): the locks those jobs' own jids hold
# are released, and nothing else. Jobs pushed through Sidekiq's client (its middleware claims their
# locks) to a redis-server of this file's own; the locks live there too.
RSpec.describe "Jobs cleared or killed through Sidekiq's API" do
  before(:all) { @server = RedisServer.new.start }
  after(:all) { @server&.shutdown }

  include_context "a Sidekiq client of its own"
  include ClearableJobHelpers

  let(:prefix) { "cleared:#{SecureRandom.hex(4)}:" }
  let(:log) { StringIO.new }
  let(:modes) { [ClearableJobs::UntilExecutedJob, ClearableJobs::UntilExecutingJob, ClearableJobs::WhileExecutingJob] }
  let(:legacy) { Sidekiq::VERSION < "7" } # 6.4's clear returns Redis's replies, 7 and 8's true

  before do
    admin.flushdb
    use_locks(prefix)
    LockManager.configure { |c| c.logger = Logger.new(log) }
  end

  # A job written into a queue as another process's push would have left it.
  def raw_job(klass_name, args, jid)
    JSON.generate("class" => klass_name, "args" => args, "jid" => jid, "queue" => "parked",
                  "created_at" => Time.now.to_f, "enqueued_at" => Time.now.to_f)
  end

  it "Queue#clear releases the locks of the unique jobs it removes, of each mode, and no other's" do
    jids = modes.to_h { |klass| [klass, park(klass, 1)] }
    park(ClearableJobs::PlainJob, 1)
    Sidekiq::Client.push("class" => "Elsewhere::UnknownJob", "queue" => "parked", "args" => [1])
    admin.lpush("queue:parked", "not a job")
    admin.lpush("queue:parked", raw_job(ClearableJobs::KeyedJob.name, ["unkeyable"], "k-jid"))
    # A job of the queue whose key another jid holds, and the run lock of a running :until_and_while_executing.
    LockManager.locker.claim([key_of(ClearableJobs::UntilExecutedJob, 2)], ["running-jid"], [60])
    admin.lpush("queue:parked", raw_job(ClearableJobs::UntilExecutedJob.name, [2], "stale-jid"))
    run_key = "#{key_of(ClearableJobs::WhileExecutingJob, 1)}:run"
    LockManager.locker.claim([run_key], ["running-jid"], [60])
    other_queue = ClearableJobs::UntilExecutedJob.set(queue: "other").perform_async(3)
    expect(modes.map { |klass| holder(key_of(klass, 1)) }).to eq(jids.values)
    expect(admin.llen("queue:parked")).to eq(8)

    cleared = through_api_pool { Sidekiq::Queue.new("parked").clear }

    expect(cleared).to eq(legacy ? [1, true] : true)
    expect([admin.exists?("queue:parked"), admin.sismember("queues", "parked")]).to eq([false, false])
    expect(modes.map { |klass| holder(key_of(klass, 1)) }).to eq([nil, nil, nil])
    expect([holder(key_of(ClearableJobs::UntilExecutedJob, 2)), holder(run_key)]).to eq(%w[running-jid running-jid])
    expect(admin.lrange("queue:other", 0, -1).map { |line| JSON.parse(line)["jid"] }).to eq([other_queue])
    expect(holder(key_of(ClearableJobs::UntilExecutedJob, 3))).to eq(other_queue)
    expect(admin.keys("lock_manager:cleared:*")).to eq([]) # what the clear took is gone
    expect(log.string).to include("the lock of a removed #{ClearableJobs::KeyedJob.name} job expires after " \
                                  "unique_for: ArgumentError: no key for unkeyable")
    again = modes.map { |klass| park(klass, 1) }
    expect(again).to all(be_a(String))
    expect(modes.map { |klass| holder(key_of(klass, 1)) }).to eq(again)
  end

  it "Queue#clear of an empty queue leaves no key behind" do
    cleared = through_api_pool { Sidekiq::Queue.new("empty").clear }

    expect(cleared).to eq(legacy ? [0, false] : true)
    expect(admin.keys("*")).to eq([])
  end

  it "Queue#💣, Sidekiq's alias of clear, releases the locks as clear does" do
    jid = park(ClearableJobs::UntilExecutedJob, 1)
    expect(holder(key_of(ClearableJobs::UntilExecutedJob, 1))).to eq(jid)

    expect(through_api_pool { Sidekiq::Queue.new("parked").public_send(:💣) }).to eq(legacy ? [1, true] : true)

    expect([admin.exists?("queue:parked"), holder(key_of(ClearableJobs::UntilExecutedJob, 1))]).to eq([false, nil])
  end

  it "ScheduledSet#clear releases the locks of the scheduled jobs, which are pushed again" do
    jids = modes.to_h { |klass| [klass, klass.perform_in(3600, 1)] }
    ClearableJobs::PlainJob.perform_in(3600, 1)
    expect(modes.map { |klass| holder(key_of(klass, 1)) }).to eq(jids.values)
    expect(modes.map { |klass| klass.perform_in(3600, 1) }).to eq([nil, nil, nil]) # each lock held

    cleared = through_api_pool { Sidekiq::ScheduledSet.new.clear }

    expect(cleared).to eq(legacy ? 1 : true)
    expect(admin.exists?("schedule")).to be(false)
    expect(modes.map { |klass| holder(key_of(klass, 1)) }).to eq([nil, nil, nil])
    expect(modes.map { |klass| klass.perform_in(3600, 1) }).to all(be_a(String))
    expect(through_api_pool { Sidekiq::ScheduledSet.new.clear }).to eq(legacy ? 1 : true)
    expect(through_api_pool { Sidekiq::ScheduledSet.new.clear }).to eq(legacy ? 0 : true)
  end

  it "RetrySet#clear and DeadSet#clear release the locks of their own jobs only" do
    retried = move_to(Sidekiq::RetrySet, ClearableJobs::UntilExecutedJob, "retried")
    dead = move_to(Sidekiq::DeadSet, ClearableJobs::UntilExecutedJob, "dead")
    retried_key = key_of(ClearableJobs::UntilExecutedJob, "retried")
    dead_key = key_of(ClearableJobs::UntilExecutedJob, "dead")
    expect([holder(retried_key), holder(dead_key)]).to eq([retried, dead])

    expect(through_api_pool { Sidekiq::RetrySet.new.clear }).to eq(legacy ? 1 : true)
    expect([holder(retried_key), holder(dead_key)]).to eq([nil, dead])
    expect(admin.zcard("dead")).to eq(1)

    expect(through_api_pool { Sidekiq::DeadSet.new.public_send(:💣) }).to eq(legacy ? 1 : true) # clear's alias
    expect(holder(dead_key)).to be_nil
    expect([park(ClearableJobs::UntilExecutedJob, "retried"), park(ClearableJobs::UntilExecutedJob, "dead")])
      .to all(be_a(String))
  end

  it "killing a job (Retries' Kill, RetrySet#kill_all) releases its lock; the dead job stays dead" do
    first, second, third = %w[first second third].map do |id|
      move_to(Sidekiq::RetrySet, ClearableJobs::UntilExecutedJob, id)
    end
    keys = %w[first second third].map { |id| key_of(ClearableJobs::UntilExecutedJob, id) }
    # A lock another jid took for the third job's key meanwhile: killing the third leaves it.
    admin.set("#{prefix}#{keys[2]}", "newer-jid")

    through_api_pool { Sidekiq::RetrySet.new.find_job(first).kill }

    expect(keys.map { |key| holder(key) }).to eq([nil, second, "newer-jid"])
    expect(admin.zrange("dead", 0, -1).map { |line| JSON.parse(line)["jid"] }).to eq([first])
    expect(park(ClearableJobs::UntilExecutedJob, "first")).to be_a(String)

    through_api_pool { Sidekiq::RetrySet.new.kill_all }

    expect(keys.map { |key| holder(key) }.drop(1)).to eq([nil, "newer-jid"])
    expect(admin.zrange("dead", 0, -1).map { |line| JSON.parse(line)["jid"] }).to contain_exactly(first, second, third)
    expect(admin.zcard("retry")).to eq(0)
  end

  it "keeps every lock with its job while 5,000 are cleared and pushes go on", timeout: 180 do
    count = 5_000
    klass = ClearableJobs::UntilExecutedJob
    Sidekiq::Client.push_bulk("class" => klass, "queue" => "parked", "args" => Array.new(count) { |n| [n] })
    expect(admin.llen("queue:parked")).to eq(count)
    pushes = Thread::Queue.new
    stop = false
    # Pushes of cleared jobs' arguments (refused until their locks go) and of new ones, all along.
    pusher = Thread.new do
      Sidekiq::Client.via(@pool) do
        pushes << [(args = rand(count + 500)), klass.set(queue: "parked").perform_async(args)] until stop
      end
    end
    eventually(timeout: 30) { pushes.size >= 20 }

    through_api_pool { Sidekiq::Queue.new("parked").clear }
    after_clear = pushes.size
    eventually(timeout: 30) { pushes.size >= after_clear + 100 }
    stop = true
    pusher.join

    # Each key is held by the jid of the one job of its arguments left in the queue, or by none.
    queued = admin.lrange("queue:parked", 0, -1).map { |line| JSON.parse(line) }
    expect(queued.map { |job| job["args"] }.uniq.size).to eq(queued.size)
    queued_jid = queued.to_h { |job| [key_of(klass, *job["args"]), job["jid"]] }
    keys = Array.new(count + 500) { |n| key_of(klass, n) }
    holders = keys.zip(admin.mget(*keys.map { |key| "#{prefix}#{key}" }))
    expect(holders.reject { |key, jid| jid == queued_jid[key] }).to eq([])
    accepted = Array.new(pushes.size) { pushes.pop }.select { |_, jid| jid }
    expect(accepted.count { |args, _| args < count }).to be_positive # cleared jobs' arguments pushed again
    expect(admin.keys("lock_manager:cleared:*")).to eq([])
  end

  it "clears the jobs when the locks' Redis is down: their locks expire after unique_for" do
    jid = park(ClearableJobs::UntilExecutedJob, 1)
    use_locks(prefix, url: closed_url)
    LockManager.configure { |c| c.logger = Logger.new(log) }

    expect(through_api_pool { Sidekiq::Queue.new("parked").clear }).to eq(legacy ? [1, true] : true)

    expect(admin.exists?("queue:parked")).to be(false)
    expect(holder(key_of(ClearableJobs::UntilExecutedJob, 1))).to eq(jid)
    expect(log.string).to match(/the locks of 1 removed jobs expire after unique_for/)
  end
end
