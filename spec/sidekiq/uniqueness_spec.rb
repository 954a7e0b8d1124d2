# frozen_string_literal: true

require "spec_helper"
require "digest"
require "json"
require_relative "../support/sidekiq_client"
require_relative "../support/sidekiq_process"
require_relative "../support/slow_link"
require_relative "../support/unique_jobs"

# Uniqueness from push to finish (lock_with :until_executing, :until_executed,
# :until_and_while_executing) on real `sidekiq` processes and a private redis-server. This process
# pushes as a web process would (its client middleware takes the locks; its Sidekiq log gets the
# refusals); the processes run the jobs of spec/support/unique_jobs.rb, which record what they did.
RSpec.describe "Sidekiq job uniqueness end to end" do
  app = File.expand_path("../support/sidekiq_jobs.rb", __dir__)
  unique_for = UniqueJobs::UNIQUE_FOR

  before(:all) do
    @server = RedisServer.new.start
    @timeline = "timeline:#{SecureRandom.hex(4)}"
    @env = { "REDIS_URL" => @server.url, "LOCK_PREFIX" => "uq:", "TIMELINE_KEY" => @timeline }
    @sidekiq = SidekiqProcess.new(app: app, env: @env).start
  end

  after(:all) do
    @sidekiq&.stop
    @server&.shutdown
  end

  include_context "a Sidekiq client of its own"

  before do
    use_locks("uq:")
    @client_log.truncate(0)
    @client_log.rewind
  end

  after do
    admin.del("queue:parked")
  end

  let(:id) { rand(1 << 30) }

  # The default key of an until_* job: its class and a digest of its arguments as JSON.
  def default_key(klass, *args)
    "#{klass.name}:#{Digest::SHA256.hexdigest(JSON.generate(args))[0, 32]}"
  end

  def holder(key, prefix = "uq:")
    admin.get("#{prefix}#{key}")
  end

  # [class, key, holder jid] of each push this process refused, from its Sidekiq log.
  def refusals
    @client_log.string.scan(/lock_manager: refused (\S+) jid=\h+: lock "([^"]+)" is held by jid=(\h+)$/)
  end

  def events(jid: nil, klass: nil)
    Timeline.read(admin, @timeline).select do |e|
      (jid.nil? || e["jid"] == jid) && (klass.nil? || e["class"] == klass)
    end
  end

  def wait_for_event(jid, event, timeout: 10)
    eventually(timeout: timeout, interval: 0.02) { events(jid: jid).find { |e| e["event"] == event } }
  end

  # A pushed job sent to the running process: it waited in a queue no process reads.
  def release_parked
    admin.lmove("queue:parked", "queue:default", "RIGHT", "LEFT")
  end

  # [job, score] of the job in Sidekiq's retry or dead set.
  def entry(set, jid)
    admin.zrange(set, 0, -1, with_scores: true).map { |json, score| [JSON.parse(json), score] }
         .find { |job, _| job["jid"] == jid }
  end

  # What the redis-server ran while the block ran (MONITOR): the client ("host:port", or "lua"
  # inside a script), the command's name and arguments.
  def monitored
    monitor = Redis.new(url: @server.url, timeout: 30)
    lines = Queue.new
    ready = Queue.new
    closing = false
    thread = Thread.new do
      monitor.monitor { |line| line == "OK" ? ready << true : lines << line }
    rescue StandardError # redis-rb 4 raises its own errors here, redis-rb 5 redis-client's
      raise unless closing
    end
    ready.pop
    yield
    sleep 0.3 # the last commands reach MONITOR
    closing = true
    monitor.close
    thread.join(5)
    Array.new(lines.size) { lines.pop }.filter_map do |line|
      match = line.match(/\A[\d.]+ \[\d+ ([^\]]+)\] (.*)\z/m) or next
      name, *args = match[2].scan(/"((?:[^"\\]|\\.)*)"/m).flatten
      { client: match[1], name: name.upcase, args: args }
    end
  end

  it "the story: 5 pushes before the job ran, 1 accepted and 4 refused naming it; it runs once, then a push is " \
     "accepted again" do
    args = [id, 0.2]
    key = default_key(UniqueJobs::UntilExecutedJob, *args)
    parked = UniqueJobs::UntilExecutedJob.set(queue: "parked")
    pushed_at = monotonic
    jids = Array.new(5) { parked.perform_async(*args) }
    first = jids.first

    expect(first).to be_a(String)
    expect(jids.drop(1)).to eq([nil] * 4)
    expect(holder(key)).to eq(first)
    expect(LockManager.locker.holder(key)).to eq(first)
    pttl = admin.pttl("uq:#{key}")
    since_push_ms = ((monotonic - pushed_at) * 1000).ceil # after PTTL's reply: it spans the read
    expect(pttl).to be_between((unique_for * 1_000) - since_push_ms, unique_for * 1_000)
    expect(refusals).to eq([["UniqueJobs::UntilExecutedJob", key, first]] * 4)
    refused_jids = @client_log.string.scan(/refused UniqueJobs::UntilExecutedJob jid=(\h+)/).flatten
    expect(refused_jids.uniq.size).to eq(4)
    expect(refused_jids).not_to include(first)
    expect(admin.llen("queue:parked")).to eq(1)

    release_parked
    wait_for_event(first, "done")
    ran = events(klass: "UniqueJobs::UntilExecutedJob").select { |e| e["args"] == args && e["event"] == "working" }
    expect(ran.map { |e| e["jid"] }).to eq([first])
    expect(admin.exists?("uq:#{key}")).to be(false)

    again = UniqueJobs::UntilExecutedJob.perform_async(*args)
    expect(again).to be_a(String)
    expect(again).not_to eq(first)
    wait_for_event(again, "done")
    expect(refusals.size).to eq(4)
  end

  it "keys on the class and the arguments: other arguments, or another class with the same ones, are accepted" do
    one = UniqueJobs::UntilExecutedJob.set(queue: "parked")
    other = UniqueJobs::OtherUntilExecutedJob.set(queue: "parked")
    jids = [one.perform_async(id, 0), one.perform_async(id + 1, 0), other.perform_async(id, 0)]
    keys = [default_key(UniqueJobs::UntilExecutedJob, id, 0), default_key(UniqueJobs::UntilExecutedJob, id + 1, 0),
            default_key(UniqueJobs::OtherUntilExecutedJob, id, 0)]

    expect(jids).to all(be_a(String))
    expect(keys.map { |key| holder(key) }).to eq(jids)
    expect(refusals).to eq([])
    expect([one.perform_async(id, 0), other.perform_async(id, 0)]).to eq([nil, nil])
    expect(refusals.map(&:last)).to eq([jids[0], jids[2]])
  end

  it ":until_executing releases the lock when the job starts: a push while it runs is accepted" do
    args = [id, 1.0]
    key = default_key(UniqueJobs::UntilExecutingJob, *args)
    first = UniqueJobs::UntilExecutingJob.perform_async(*args)
    wait_for_event(first, "working")

    expect(admin.exists?("uq:#{key}")).to be(false)
    second = UniqueJobs::UntilExecutingJob.perform_async(*args)
    expect(second).to be_a(String)
    expect(holder(key)).to eq(second).or be_nil # the second may have started already
    wait_for_event(first, "done")
    wait_for_event(second, "done")
    expect(refusals).to eq([])
  end

  it ":until_executed keeps the lock while the job runs (TTL timeout, renewed): a push meanwhile is refused" do
    args = [id, 1.0]
    key = default_key(UniqueJobs::UntilExecutedJob, *args)
    first = UniqueJobs::UntilExecutedJob.perform_async(*args)
    wait_for_event(first, "working")

    expect(holder(key)).to eq(first)
    expect(admin.pttl("uq:#{key}")).to be_between(1, 30_000) # adopted: the run's timeout, no longer unique_for
    expect(UniqueJobs::UntilExecutedJob.perform_async(*args)).to be_nil
    expect(refusals).to eq([["UniqueJobs::UntilExecutedJob", key, first]])
    wait_for_event(first, "done")
    expect(admin.exists?("uq:#{key}")).to be(false)
  end

  it ":until_executed keeps a failed job's lock until its retry is due plus unique_for: a duplicate is refused " \
     "while it waits in the retry set" do
    key = default_key(UniqueJobs::RetriedJob, id)
    jid = UniqueJobs::RetriedJob.perform_async(id)
    job, retry_at = eventually(timeout: 10, interval: 0.02) { entry("retry", jid) }

    expect(job["error_message"]).to eq("UniqueJobs::RetriedJob #{id} fails")
    expect(holder(key)).to eq(jid)
    expect(LockManager.locker.holder(key)).to eq(jid)
    pttl = admin.pttl("uq:#{key}")
    expect(pttl).to be > unique_for * 1_000
    expect(Time.now.to_f + (pttl / 1_000.0)).to be >= retry_at + unique_for - 0.5 # it outlives the retry's time
    expect(UniqueJobs::RetriedJob.perform_async(id)).to be_nil
    expect(refusals).to eq([["UniqueJobs::RetriedJob", key, jid]])
  ensure
    admin.zremrangebyscore("retry", "-inf", "+inf")
  end

  it ":until_executed: Sidekiq's own push of the retry finds the lock held by the job's jid and keeps it; the " \
     "retry runs and releases it" do
    key = default_key(UniqueJobs::FlakyJob, id)
    jid = UniqueJobs::FlakyJob.perform_async(id)
    _, retry_at = eventually(timeout: 10, interval: 0.02) { entry("retry", jid) }
    pttl = admin.pttl("uq:#{key}")

    expect(holder(key)).to eq(jid)
    expect(Time.now.to_f + (pttl / 1_000.0)).to be >= retry_at + unique_for - 0.5 # sidekiq_retry_in's 1 s
    wait_for_event(jid, "done", timeout: 15)
    runs = events(jid: jid).map { |e| e["event"] }
    expect(runs).to eq(["start", "start", "working", "flaky #{id} succeeded", "done"]) # failed, then retried
    expect(admin.exists?("uq:#{key}")).to be(false)
    expect(@sidekiq.log).not_to include("jid=#{jid}: lock")
  ensure
    admin.del("flaky:#{id}")
  end

  it ":until_executed releases a failed job's lock when no retry follows (retry: false)" do
    key = default_key(UniqueJobs::UnretriedJob, id)
    jid = UniqueJobs::UnretriedJob.perform_async(id)
    expect(holder(key)).to eq(jid)
    wait_for_event(jid, "working")
    expect(holder(key)).to eq(jid)

    eventually(timeout: 10) { @sidekiq.log.include?("UniqueJobs::UnretriedJob #{id} fails") }
    eventually { !admin.exists?("uq:#{key}") }
    expect([entry("retry", jid), entry("dead", jid)]).to eq([nil, nil])
    expect(UniqueJobs::UnretriedJob.set(queue: "parked").perform_async(id)).to be_a(String)
  end

  it ":until_executed releases a failed job's lock when its retries are exhausted (retry: 0): the job is dead" do
    key = default_key(UniqueJobs::ExhaustedJob, id)
    jid = UniqueJobs::ExhaustedJob.perform_async(id)
    expect(holder(key)).to eq(jid)
    job, = eventually(timeout: 10, interval: 0.02) { entry("dead", jid) }

    expect(job["error_message"]).to eq("UniqueJobs::ExhaustedJob #{id} fails")
    expect(admin.exists?("uq:#{key}")).to be(false)
    expect(entry("retry", jid)).to be_nil
  ensure
    admin.del("dead")
  end

  it "perform_in: the pending lock lives the delay plus unique_for; Sidekiq's scheduled push keeps it; the job " \
     "runs and releases it" do
    args = [id, 0]
    key = default_key(UniqueJobs::UntilExecutedJob, *args)
    pushed_at = Time.now.to_f
    jid = UniqueJobs::UntilExecutedJob.perform_in(3, *args)
    pttl = admin.pttl("uq:#{key}")

    expect(holder(key)).to eq(jid)
    since_push_ms = ((Time.now.to_f - pushed_at) * 1000).ceil
    expect(pttl).to be_between(((3 + unique_for) * 1_000) - since_push_ms, (3 + unique_for) * 1_000)
    expect(UniqueJobs::UntilExecutedJob.perform_async(*args)).to be_nil

    working = wait_for_event(jid, "working", timeout: 15)
    wait_for_event(jid, "done")
    expect(working["at"]).to be >= pushed_at + 3
    expect(admin.exists?("uq:#{key}")).to be(false)
    expect(@sidekiq.log).not_to include("jid=#{jid}: lock")
  end

  it ":until_and_while_executing: refused while pending, accepted once the first started, but the second never " \
     "runs beside it (run lock, on_conflict skip)" do
    args = [id, 1.0]
    key = default_key(UniqueJobs::WhileExecutingJob, *args)
    parked = UniqueJobs::WhileExecutingJob.set(queue: "parked")
    first = parked.perform_async(*args)
    expect(parked.perform_async(*args)).to be_nil
    expect(refusals).to eq([["UniqueJobs::WhileExecutingJob", key, first]])

    release_parked
    wait_for_event(first, "working")
    expect(admin.exists?("uq:#{key}")).to be(false) # the enqueue lock: released at start
    expect(admin.exists?("uq:#{key}:run")).to be(true)
    second = UniqueJobs::WhileExecutingJob.perform_async(*args)
    expect(second).to be_a(String)
    skipped = wait_for_event(second, "skipped")
    done = wait_for_event(first, "done")

    working = events(jid: first).find { |e| e["event"] == "working" }
    expect(events(jid: second).map { |e| e["event"] }).to eq(%w[start skipped])
    expect(skipped["at"]).to be_between(working["at"], done["at"])
    expect(held_keys(admin, "uq:#{key}*")).to eq([])
    expect(@sidekiq.log[/lock_manager: skipped UniqueJobs::WhileExecutingJob jid=#{second}: .*/])
      .to eq(%(lock_manager: skipped UniqueJobs::WhileExecutingJob jid=#{second}: lock "#{key}:run" is held))
  end

  it "perform_bulk of 1,000 jobs: repeated and already locked ones are refused, and all the claims take one " \
     "round trip" do
    link = SlowLink.new(@server.port)
    use_locks("uq:", url: link.url)
    parked = UniqueJobs::BulkJob.set(queue: "parked")
    base = id * 2_000
    # Through the link without delay: these pushes also open the pooled connection and load the script.
    # A bulk, as the one measured: a single push's claim travels in another script (OnePush).
    locked = parked.perform_bulk(Array.new(20) { |n| [base + 1_000 + n] })
    numbers = (0...880).to_a + (0...100).to_a + (1_000...1_020).to_a # 100 repeated, 20 locked already
    args = numbers.map { |n| [base + n] }.shuffle(random: Random.new(7))
    firsts = args.each_index.group_by { |i| args[i] }.values.map(&:first)
    accepted = firsts.reject { |i| args[i][0] >= base + 1_000 }.sort # the first of each, unless locked already

    link.slow_down(0.3)
    result = nil
    commands = monitored { result = parked.perform_bulk(args) }
    round_trips = link.round_trips
    link.close

    expect(locked).to all(be_a(String))
    expect(accepted.size).to eq(880)
    if Sidekiq::VERSION.to_i >= 7 # a refused job is nil in 7's list, left out of 6.4's
      expect(result.size).to eq(1_000)
      expect(result.each_index.select { |i| result[i] }).to eq(accepted)
    end
    jids = result.compact
    expect(jids.size).to eq(880)

    queued = admin.lrange("queue:parked", 0, -1).map { |json| JSON.parse(json) }
                  .select { |job| jids.include?(job["jid"]) }
    expect(queued.to_h { |job| [job["jid"], job["args"]] }).to eq(jids.zip(accepted.map { |i| args[i] }).to_h)
    keys = queued.map { |job| default_key(UniqueJobs::BulkJob, *job["args"]) }
    expect(admin.mget(*keys.map { |key| "uq:#{key}" })).to eq(queued.map { |job| job["jid"] })
    locked_keys = (0...20).map { |n| default_key(UniqueJobs::BulkJob, base + 1_000 + n) }
    expect(admin.mget(*locked_keys.map { |key| "uq:#{key}" })).to eq(locked)

    refused = refusals
    expect(refused.size).to eq(120)
    expect(refused.map { |_, key, jid| holder(key) == jid }).to all(be(true))
    expect(refused.map { |_, key, _| key }.sort)
      .to eq((args.each_index.to_a - accepted).map { |i| default_key(UniqueJobs::BulkJob, *args[i]) }.sort)

    claims = commands.select do |c|
      %w[EVAL EVALSHA].include?(c[:name]) && c[:args][2].to_s.start_with?("uq:UniqueJobs::BulkJob:")
    end
    expect(claims.size).to eq(1_000) # one claim per job, repeated ones too
    expect(claims.map { |c| c[:name] }.uniq).to eq(["EVALSHA"])
    expect(claims.map { |c| c[:client] }.uniq.size).to eq(1)
    expect(commands.count { |c| c[:client] == claims.first[:client] }).to eq(1_000) # nothing else on that connection
    expect(round_trips).to eq(1)
  ensure
    link&.close
  end

  it "Sidekiq's TERM puts a running job back in its queue, and the job keeps its lock" do
    # One thread: an idle one's BRPOP would take the job Sidekiq pushes back, just before it stops.
    sidekiq = SidekiqProcess.new(app: app, env: @env.merge("LOCK_PREFIX" => "term:"), queue: "stopped",
                                 concurrency: 1, shutdown_timeout: 1).start
    use_locks("term:")
    key = default_key(UniqueJobs::SleeperJob, 30)
    jid = UniqueJobs::SleeperJob.set(queue: "stopped").perform_async(30)
    wait_for_event(jid, "working")
    sidekiq.stop(:TERM)

    expect(admin.lrange("queue:stopped", 0, -1).map { |json| JSON.parse(json)["jid"] }).to eq([jid])
    expect(holder(key, "term:")).to eq(jid)
    expect(admin.pttl("term:#{key}")).to be_within(2_000).of(unique_for * 1_000)
    expect(UniqueJobs::SleeperJob.set(queue: "stopped").perform_async(30)).to be_nil
    expect(refusals).to eq([["UniqueJobs::SleeperJob", key, jid]])
  ensure
    sidekiq&.stop
    admin.del("queue:stopped")
  end

  it "a job SIGKILLed while it runs leaves its lock for its timeout (3 s) at most, and nothing else" do
    sidekiq = SidekiqProcess.new(app: app, env: @env.merge("LOCK_PREFIX" => "kill:"), queue: "killed").start
    use_locks("kill:")
    key = default_key(UniqueJobs::SleeperJob, 30)
    jid = UniqueJobs::SleeperJob.set(queue: "killed").perform_async(30)
    wait_for_event(jid, "working")

    expect(holder(key, "kill:")).to eq(jid)
    expect(admin.pttl("kill:#{key}")).to be_between(1, 3_000)
    sidekiq.stop(:KILL)
    gone = elapsed { eventually(timeout: 6, interval: 0.02) { !admin.exists?("kill:#{key}") } }
    expect(gone).to be < 3 + 1
    expect(held_keys(admin, "kill:*")).to eq([])
  ensure
    sidekiq&.stop(:KILL)
  end

  it "a lock_with class loaded lazily, after the process ran jobs, still runs under its lock" do
    lazy = SidekiqProcess.new(app: File.expand_path("../support/lazy_app.rb", __dir__),
                              env: @env.merge("LOCK_PREFIX" => "lazy:"), queue: "lazy").start
    Sidekiq::Client.push("class" => "LazyLoader", "args" => [1.0], "queue" => "lazy")
    loader = eventually(timeout: 10, interval: 0.02) { events(klass: "LazyLoader").first }
    pushed = loader["args"]

    expect(pushed["LazyJob"]).to all(be_a(String))
    expect(pushed["LazyUniqueJob"]).to match([a_kind_of(String), nil])
    # Sidekiq's "done" line of each, ran or skipped ("class=LazyJob jid=… INFO: done"; 8: "jid=… class=LazyJob…: done")
    eventually(timeout: 10) { lazy.log.scan(/\bclass=LazyJob\b.*\bdone$/).size == 3 }
    wait_for_event(pushed["LazyUniqueJob"].first, "done")

    expect(events(klass: "LazyJob").count { |e| e["event"] == "working" }).to eq(1)
    expect(lazy.log.scan(/lock_manager: skipped LazyJob jid=(\h+): lock "lazy" is held/).flatten)
      .to match_array(pushed["LazyJob"] - events(klass: "LazyJob").map { |e| e["jid"] })
    expect(lazy.log.scan(/lock_manager: refused LazyUniqueJob jid=\h+: lock "lazy-unique" is held by jid=(\h+)/))
      .to eq([[pushed["LazyUniqueJob"][0]]])
    expect(held_keys(admin, "lazy:*")).to eq([])
  ensure
    lazy&.stop
  end
end
