# frozen_string_literal: true

require "spec_helper"
require "json"
require_relative "../support/sidekiq_client"
require_relative "../support/sidekiq_process"
require_relative "../support/monitor"
# Loaded here too: this process pushes as a web process would (its client middleware claims).
require_relative "../support/iterable_jobs" if defined?(Sidekiq::IterableJob)

# Sidekiq::IterableJob (Sidekiq 7.3+) on real `sidekiq` processes and a private redis-server. Sidekiq
# interrupts an iteration when it stops (TERM; on 8, also after max_iteration_runtime) and pushes the
# job back, same jid, with its cursor saved: the next process resumes it where it stopped. The jobs of
# spec/support/iterable_jobs.rb record each item with the value of their lock key at that moment.
RSpec.describe "Sidekiq::IterableJob with lock_with" do
  before(:all) do
    skip "Sidekiq #{Sidekiq::VERSION} has no Sidekiq::IterableJob (new in 7.3)" unless defined?(Sidekiq::IterableJob)

    @server = RedisServer.new.start
    @timeline = "timeline:#{SecureRandom.hex(4)}"
    @env = { "REDIS_URL" => @server.url, "LOCK_PREFIX" => "it:", "TIMELINE_KEY" => @timeline }
  end

  after(:all) { @server&.shutdown }

  include_context "a Sidekiq client of its own"

  before { use_locks("it:") }

  after do
    admin.del("queue:iterable", "schedule")
  end

  # One thread, so that the job pushed back at TERM is not fetched again by another one as it stops.
  def start_sidekiq(env = {})
    SidekiqProcess.new(app: File.expand_path("../support/iterable_jobs.rb", __dir__), env: @env.merge(env),
                       queue: "iterable", concurrency: 1, shutdown_timeout: 5).start
  end

  def events(jid)
    Timeline.read(admin, @timeline).select { |e| e["jid"] == jid }
  end

  # [item, holder of the job's lock key while it ran] of each iteration, in order.
  def items(jid)
    events(jid).select { |e| e["event"] == "item" }.map { |e| e["args"] }
  end

  def completed?(jid)
    events(jid).any? { |e| e["event"] == "complete" }
  end

  def queued
    admin.lrange("queue:iterable", 0, -1).map { |json| JSON.parse(json) }
  end

  # Runs the job until it did `count` items, then stops Sidekiq (TERM): the iteration is interrupted
  # and pushed back. Returns what the server ran meanwhile (MONITOR's lines).
  def interrupt_after(jid, count)
    sidekiq = start_sidekiq
    eventually(timeout: 10) { items(jid).size >= count }
    lines = CommandRecorder.new(@server.url).lines_while { sidekiq.stop(:TERM) }
    expect(queued.map { |job| job["jid"] }).to eq([jid])
    lines
  ensure
    sidekiq&.stop
  end

  it ":until_executed keeps the job's lock across the interruption: never released, its push back not " \
     "refused, the lock held by the jid until the resumed job's last item" do
    jid = IterableJobs::UntilExecutedJob.perform_async(25)
    lines = interrupt_after(jid, 3)

    expect(lines.grep(/"(DEL|UNLINK)" "it:iter-unique"/i)).to eq([])
    expect(admin.get("it:iter-unique")).to eq(jid)
    # unique_for from its push back (the running job's lock lived timeout: 30 s), less the time TERM took
    expect(admin.pttl("it:iter-unique")).to be_between(40_000, IterableJobs::UNIQUE_FOR * 1_000)
    expect(IterableJobs::UntilExecutedJob.perform_async(25)).to be_nil # a duplicate, while it waits to resume
    expect(@client_log.string).to match(/refused \S+ jid=\h+: lock "iter-unique" is held by jid=#{jid}$/)

    sidekiq = start_sidekiq
    eventually(timeout: 20) { completed?(jid) }
    expect(items(jid).map(&:first)).to eq((0...25).to_a) # resumed at its cursor: each item once
    expect(items(jid).map(&:last).uniq).to eq([jid])
    eventually { !admin.exists?("it:iter-unique") }
  ensure
    sidekiq&.stop
  end

  it ":until_executed keeps the lock through Sidekiq 8's max_iteration_runtime interruptions, in one process" do
    skip "max_iteration_runtime came with Sidekiq 8" if Sidekiq::VERSION.to_i < 8

    sidekiq = start_sidekiq("MAX_ITERATION_RUNTIME" => "1")
    jid = nil
    lines = CommandRecorder.new(@server.url).lines_while do
      jid = IterableJobs::UntilExecutedJob.perform_async(25) # 5 s of items: interrupted every second
      eventually(timeout: 20) { completed?(jid) }
    end

    expect(events(jid).count { |e| e["event"] == "start" }).to be >= 4 # pushed back and resumed each time
    expect(items(jid).map(&:first)).to eq((0...25).to_a)
    expect(items(jid).map(&:last).uniq).to eq([jid])
    expect(lines.grep(/"(DEL|UNLINK)" "it:iter-unique"/i).size).to eq(1) # released once: at the end
    expect(sidekiq.log).not_to include("refused")
    eventually { !admin.exists?("it:iter-unique") }
  ensure
    sidekiq&.stop
  end

  it ":nonblocking releases the lock when interrupted and takes it again when the job resumes; held by " \
     "another then, the job is rescheduled with its jid and its cursor" do
    jid = IterableJobs::NonblockingJob.perform_async(25)
    interrupt_after(jid, 3)
    before = items(jid)
    expect(admin.exists?("it:iter-run")).to be(false)

    held = LockManager.locker.try_lock("iter-run", timeout: 30)
    sidekiq = start_sidekiq
    eventually(timeout: 10) { admin.zcard("schedule") == 1 }
    expect(JSON.parse(admin.zrange("schedule", 0, -1).first)["jid"]).to eq(jid)
    expect(items(jid)).to eq(before)
    held.release

    eventually(timeout: 20) { completed?(jid) }
    expect(items(jid).map(&:first)).to eq((0...25).to_a)
    first_run, resumed = items(jid).map(&:last).partition.with_index { |_, index| index < before.size }
    expect([first_run.uniq.size, resumed.uniq.size]).to eq([1, 1]) # one lock per run...
    expect(resumed.first).not_to eq(first_run.first) # ...taken again on resume
    expect([first_run.first, resumed.first]).to all(match(SpecHelpers::TOKEN))
    eventually { !admin.exists?("it:iter-run") }
  ensure
    held&.release
    sidekiq&.stop
  end

  it ":blocking releases the lock when interrupted and waits for it again when the job resumes" do
    jid = IterableJobs::BlockingJob.perform_async(25)
    interrupt_after(jid, 3)
    before = items(jid)
    expect(admin.exists?("it:iter-wait")).to be(false)

    held = LockManager.locker.try_lock("iter-wait", timeout: 30)
    sidekiq = start_sidekiq
    eventually { events(jid).count { |e| e["event"] == "start" } == 2 } # resumed, waiting
    sleep 1
    expect(items(jid)).to eq(before)
    held.release

    eventually(timeout: 20) { completed?(jid) }
    expect(items(jid).map(&:first)).to eq((0...25).to_a)
    resumed = items(jid).drop(before.size).map(&:last).uniq
    expect(resumed.size).to eq(1)
    expect(resumed.first).to match(SpecHelpers::TOKEN)
    expect(resumed.first).not_to eq(before.first.last)
    eventually { !admin.exists?("it:iter-wait") }
  ensure
    held&.release
    sidekiq&.stop
  end
end
