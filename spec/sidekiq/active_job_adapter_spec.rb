# frozen_string_literal: true

require "spec_helper"
require_relative "../support/job_events"
require "digest"
require "json"
require "logger"
require "stringio"
require_relative "../support/monitor"
require_relative "../support/sidekiq_process"
require_relative "../support/sidekiq_client"
require_relative "../support/active_job_app"

# ActiveJob on the Sidekiq adapter: this process enqueues with perform_later (Rails 6.1's adapter on
# Sidekiq 6.4, Sidekiq's own on 7.3), a real Sidekiq process (sidekiq -r spec/support/active_job_app.rb,
# concurrency 10) runs the jobs on a private redis-server. Every assertion reads what the jobs recorded
# in Redis, the locks there, and the two processes' logs.
RSpec.describe "ActiveJob on the Sidekiq adapter, end to end" do
  include JobEvents

  app = File.expand_path("../support/active_job_app.rb", __dir__)

  before(:all) do
    @server = RedisServer.new.start
    @timeline = "aj-timeline:#{SecureRandom.hex(4)}"
    env = { "REDIS_URL" => @server.url, "LOCK_PREFIX" => lock_prefix, "TIMELINE_KEY" => @timeline }
    @sidekiq = SidekiqProcess.new(app: app, env: env, concurrency: 10).start
    # Pushes go through a pool of this spec's own (Sidekiq 7 keeps the first pool its configuration
    # made: configure_client here would take the suite's other Sidekiq specs along).
    @pool = Sidekiq::RedisConnection.create(url: @server.url, size: 2)
    @logger = ActiveJob::Base.logger
    @log = StringIO.new
    ActiveJob::Base.logger = ActiveSupport::TaggedLogging.new(Logger.new(@log))
  end

  after(:all) do
    @sidekiq&.stop
    ActiveJob::Base.logger = @logger
    @server&.shutdown
    reset_lock_manager!
  end

  let(:admin) { @server.client }

  around { |example| Sidekiq::Client.via(@pool) { example.run } }

  def lock_prefix
    "aj:"
  end

  before do # spec_helper resets LockManager's settings before every example
    LockManager.configure do |c|
      c.redis_url = @server.url
      c.key_prefix = lock_prefix
    end
    admin.del(@timeline, *admin.keys("#{@timeline}:gate:*")) # what earlier examples recorded and opened
  end

  after do
    settle
    admin.close
    reset_lock_manager!
  end

  def recorded(klass)
    Timeline.read(admin, @timeline).select { |e| e["class"] == klass.name }
  end

  def open_gate(name)
    admin.set("#{@timeline}:gate:#{name}", "1")
  end

  # Whatever an example left waiting ends: its gates open, every job that started has ended, the
  # queue is empty and no lock is left (a lock left behind fails the example).
  def settle
    %w[story report same options tpark].each { |name| open_gate(name) }
    eventually(timeout: 20, interval: 0.05) { all_ended? && queued("default").empty? && keys.empty? }
  ensure
    left = keys
    admin.del(*left) unless left.empty?
  end

  include SidekiqApiPool

  # The jobs waiting in a Sidekiq queue (read here: Sidekiq 6.4's API would not use this spec's pool).
  def queued(queue)
    admin.lrange("queue:#{queue}", 0, -1).map { |line| JSON.parse(line) }
  end

  def all_ended?
    Timeline.read(admin, @timeline).group_by { |e| e["jid"] }.values.all? do |list|
      list.none? { |e| e["event"] == "start" } || list.any? { |e| %w[done skipped].include?(e["event"]) }
    end
  end

  def keys
    held_keys(admin, "#{lock_prefix}*").sort
  end

  def most_at_once(*classes)
    Timeline.most_at_once(Timeline.work_intervals(classes.flat_map { |klass| events(klass) }, /finished/))
  end

  # The until_* default key: the class, and a digest of the arguments as ActiveJob serializes them.
  def default_key(klass, args)
    "#{klass.name}:#{Digest::SHA256.hexdigest(JSON.generate(ActiveJob::Arguments.serialize(args)))[0, 32]}"
  end

  # Top-level commands (not those inside scripts) that name `key`, sent while the block runs (MONITOR).
  def commands_naming(key, &block)
    CommandRecorder.new(@server.url).lines_while(&block)
                   .select { |line| line.include?(%("#{key}")) && !line.include?(" lua]") }
  end

  it "nonblocking: 5 jobs while the first works, exactly one result, 4 skipped, keyed on the ActiveJob class" do
    first = AjNonblockingJob.perform_later("first", "story")
    expect(first).to be_a(AjNonblockingJob)
    wait_for_job(first, "working")
    # One lock, the job's own class: never JobWrapper's, never a second one from the Sidekiq middleware
    # (which would also have made this job skip itself).
    expect(keys).to eq(["#{lock_prefix}AjNonblockingJob"])

    others = Array.new(4) { AjNonblockingJob.perform_later("other", 0) }
    expect(others).to all(be_a(AjNonblockingJob))
    wait_for(AjNonblockingJob, "skipped", 4)
    open_gate("story")
    wait_for_job(first, "done")

    expect(events(AjNonblockingJob, /finished/).map { |e| e["jid"] }).to eq([first.job_id])
    expect(events(AjNonblockingJob, "skipped").map { |e| e["jid"] }).to match_array(others.map(&:job_id))
    others.each do |job|
      expect(@sidekiq.log).to include("lock_manager: skipped AjNonblockingJob job_id=#{job.job_id}: " \
                                      "lock \"AjNonblockingJob\" is held")
    end
    expect(@sidekiq.log).not_to match(/skipped \S+ jid=\S+: lock "AjNonblockingJob"/) # the Sidekiq middleware's line
    expect(keys).to eq([])
  end

  it "until_executed: of 5 perform_later, 1 is pushed and 4 return false; after it finished a new one runs" do
    args = [7, "report"]
    key = default_key(AjReportJob, args)
    first = AjReportJob.perform_later(*args)
    expect(first).to be_a(AjReportJob)
    expect(first.successfully_enqueued?).to be(true)
    expect(first.provider_job_id).to match(/\A\h{24}\z/) # pushed: Sidekiq's jid

    refused = Array.new(4) { AjReportJob.perform_later(*args) }
    expect(refused).to eq([false] * 4)
    job = AjReportJob.new(*args)
    expect(job.enqueue).to be(false)
    expect(job.successfully_enqueued?).to be(false)
    expect(@log.string).to include("lock_manager: refused AjReportJob job_id=#{job.job_id}: lock \"#{key}\" is held " \
                                   "by #{first.job_id}")
    expect(keys).to eq(["#{lock_prefix}#{key}"])
    expect(LockManager.locker.holder(key)).to eq(first.job_id)

    wait_for_job(first, "working")
    open_gate("report")
    wait_for_job(first, "done")
    expect(keys).to eq([])
    again = AjReportJob.perform_later(*args)
    expect(again).to be_a(AjReportJob)
    wait_for_job(again, "done")

    expect(events(AjReportJob, /finished/).map { |e| e["jid"] }).to eq([first.job_id, again.job_id])
    expect(queued("default")).to eq([])
    expect(keys).to eq([])
  end

  it "a push is claimed once, by the enqueue callback: the Sidekiq client middleware leaves it alone" do
    LockManager.locker.claim(["warm-up"], ["spec"], [1]) # the claim script is loaded: one EVALSHA per claim
    LockManager.locker.release_claim("warm-up", "spec")
    key = default_key(AjReportJob, [42, 0])
    job = nil
    # To a queue no process fetches: only this process touches the lock meanwhile.
    claims = commands_naming("#{lock_prefix}#{key}") { job = AjReportJob.set(queue: "parked").perform_later(42, 0) }

    expect(job).to be_a(AjReportJob)
    expect(claims.size).to eq(1)
    expect(LockManager.locker.holder(key)).to eq(job.job_id)
    expect(queued("parked").map { |pushed| pushed["wrapped"] }).to eq(["AjReportJob"])
  ensure
    admin.del("queue:parked")
    LockManager.locker.release_claim(key, job.job_id) if job
  end

  it "a pending job deleted through Sidekiq's API (the Web UI's Delete) releases its lock at once" do
    require "sidekiq/api"
    key = default_key(AjReportJob, [43, 0])
    job = AjReportJob.set(queue: "parked").perform_later(43, 0)
    expect(LockManager.locker.holder(key)).to eq(job.job_id)

    raw = admin.lrange("queue:parked", 0, -1).first
    expect(through_api_pool { Sidekiq::JobRecord.new(raw, "parked").delete }).to be(true)

    expect(queued("parked")).to eq([])
    expect(LockManager.locker.holder(key)).to be_nil
    expect(AjReportJob.set(queue: "parked").perform_later(43, 0)).to be_a(AjReportJob)
  ensure
    admin.del("queue:parked")
    admin.del("#{lock_prefix}#{key}")
  end

  it "two ActiveJob classes with the same arguments never interfere" do
    one = AjNonblockingJob.perform_later("same", "same")
    two = AjOtherNonblockingJob.perform_later("same", "same")
    report = AjReportJob.perform_later(9, "same")
    other_report = AjOtherReportJob.perform_later(9, "same")
    expect([one, two, report, other_report]).to all(be_a(ApplicationJob))
    [one, two, report, other_report].each { |job| wait_for_job(job, "working") }
    expect(keys).to eq(["#{lock_prefix}AjNonblockingJob", "#{lock_prefix}AjOtherNonblockingJob",
                        "#{lock_prefix}#{default_key(AjOtherReportJob, [9, "same"])}",
                        "#{lock_prefix}#{default_key(AjReportJob, [9, "same"])}"].sort)
    open_gate("same")
    [one, two, report, other_report].each { |job| wait_for_job(job, "done") }

    expect(most_at_once(AjNonblockingJob, AjOtherNonblockingJob, AjReportJob, AjOtherReportJob)).to eq(4)
    expect(keys).to eq([])
  end

  it "sidekiq_options lock_manager only: the Sidekiq middleware locks it, keyed on its own class, not JobWrapper" do
    one = AjOptionsJob.perform_later("options", "options")
    two = AjOtherOptionsJob.perform_later("options", "options")
    wait_for_job(one, "working")
    wait_for_job(two, "working") # two such classes run in parallel
    expect(keys).to eq(["#{lock_prefix}AjOptionsJob", "#{lock_prefix}AjOtherOptionsJob"])

    late = AjOptionsJob.perform_later("late", 0)
    wait_for_job(late, "skipped")
    # Its line names the job as the refused push's does: by its own class, never JobWrapper.
    expect(@sidekiq.log).to match(/lock_manager: skipped AjOptionsJob jid=\h+: lock "AjOptionsJob" is held/)
    open_gate("options")
    wait_for_job(one, "done")
    wait_for_job(two, "done")

    expect(events(AjOptionsJob, /finished/).map { |e| e["jid"] }).to eq([one.job_id])
    expect(most_at_once(AjOptionsJob, AjOtherOptionsJob)).to eq(2)
    expect(keys).to eq([])
  end

  it "on_conflict: :reschedule: pushed again through the adapter after 1, then 2 s (+ up to 25%), its count in its " \
     "data; the same job runs once the lock is free" do
    LockManager.locker.claim(["aj-backoff"], ["another-owner"], [60])
    job = AjBackoffJob.perform_later("backoff", 0)
    seen = {} # count => the delay its push carries (its "at" less its "created_at"), each as it waits to be due
    eventually(timeout: 20, interval: 0.02) do
      admin.zrange("schedule", 0, -1, with_scores: true).each do |payload, at|
        pushed = JSON.parse(payload)
        data = pushed["args"].first
        next unless pushed["wrapped"] == "AjBackoffJob" && data["job_id"] == job.job_id

        created = pushed["created_at"] > 1e11 ? pushed["created_at"] / 1000.0 : pushed["created_at"] # Sidekiq 8: ms
        seen[data["lock_manager_reschedules"]] ||= at - created
      end
      seen.key?(2)
    end
    LockManager.locker.release_claim("aj-backoff", "another-owner")
    wait_for_job(job, "done")

    expect(seen[1]).to be_between(0.75, 1.25)
    expect(seen[2]).to be_between(1.75, 2.5)
    expect(events(AjBackoffJob, "working").map { |e| e["jid"] }).to eq([job.job_id])
    expect(events(AjBackoffJob, "skipped").map { |e| e["jid"] }.uniq).to eq([job.job_id])
    expect(@sidekiq.log).to include("rescheduled AjBackoffJob job_id=#{job.job_id} in ", "(reschedule 2)")
  ensure
    LockManager.locker.release_claim("aj-backoff", "another-owner")
  end

  it "on_conflict: :park: jobs that find the lock held wait in Redis, then run one at a time, each pushed by the " \
     "release before it" do
    holder = AjParkJob.perform_later("holder", "park")
    wait_for_job(holder, "working")
    parked = Array.new(3) { |number| AjParkJob.perform_later("parked #{number}", 0.05) }
    eventually(timeout: 20) { LockManager.locker.parked_count("aj-park") == 3 }
    open_gate("park")
    parked.each { |job| wait_for_job(job, "done") }

    expect(events(AjParkJob, "working").map { |e| e["jid"] }.sort).to eq([holder, *parked].map(&:job_id).sort)
    expect(most_at_once(AjParkJob)).to eq(1)
    expect(@sidekiq.log.scan(/parked AjParkJob job_id=\S+: lock "aj-park" is held by \S+ \(\d in line\)/).size).to eq(3)
    expect(@sidekiq.log).not_to include("rescheduled AjParkJob")
    expect(admin.zcard("schedule")).to eq(0) # no reschedule, and the fallback left with the last parked job
  end

  it "throttle_with on_limit: :park: jobs over a concurrency rule wait in Redis, each pushed by the end of one " \
     "with a place" do
    holders = Array.new(2) { AjThrottledParkJob.perform_later("holder", "tpark") }
    holders.each { |job| wait_for_job(job, "working") }
    parked = Array.new(3) { |number| AjThrottledParkJob.perform_later("parked #{number}", 0.05) }
    eventually(timeout: 20) { LockManager.locker.parked_count("aj-throttle-park") == 3 }
    open_gate("tpark")
    parked.each { |job| wait_for_job(job, "done") }

    expect(events(AjThrottledParkJob, "working").map do |e|
             e["jid"]
           end.sort).to eq([*holders, *parked].map(&:job_id).sort)
    expect(most_at_once(AjThrottledParkJob)).to eq(2)
    parked_line = /parked AjThrottledParkJob job_id=\S+: limiter "aj-throttle-park" has no free place \(\d in line\)/
    expect(@sidekiq.log.scan(parked_line).size).to eq(3)
    expect(@sidekiq.log).not_to include("throttled AjThrottledParkJob")
    expect(admin.zcard("schedule")).to eq(0) # no reschedule, and the fallback left with the last parked job
  end

  it "a server middleware the app adds after requiring lock_manager/sidekiq runs too" do
    seen = admin.get("#{@timeline}:late").to_i
    job = AjOtherNonblockingJob.perform_later("late", 0)
    wait_for_job(job, "done")

    # Sidekiq 7: LockManager::Sidekiq.install reads every capsule's chain, and a capsule copies the
    # configuration's chain when first read; the CLI makes the default capsule before it loads the app.
    expect(admin.get("#{@timeline}:late").to_i).to be > seen
  end
end
