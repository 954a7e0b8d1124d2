# frozen_string_literal: true

require "spec_helper"
require_relative "../support/job_events"
require "active_job"
require "concurrent"
require "digest"
require "json"
require "logger"
require "stringio"
require_relative "../../demo/timeline"

# ActiveJob classes that include LockManager::Worker, run in this process by the :async adapter (and
# by :inline where the caller must see the outcome), on a private redis-server. Every job records what
# it did in AjAsync.events, in the shape demo/timeline.rb reads ("class", "jid" (the job_id), "args",
# "event", "at"). A job given a String as `hold` works until the spec opens that gate.
module AjAsync
  Boom = Class.new(StandardError)

  @events = []
  @mutex = Mutex.new
  @gates = Concurrent::Map.new
  @running = Concurrent::AtomicFixnum.new

  class << self
    attr_reader :running

    def record(job, event)
      entry = { "at" => Time.now.to_f, "class" => job.class.name, "jid" => job.job_id, "args" => job.arguments,
                "executions" => job.executions, "event" => event }
      @mutex.synchronize { @events << entry }
    end

    def events(klass = nil)
      all = @mutex.synchronize { @events.dup }
      klass ? all.select { |e| e["class"] == klass.name } : all
    end

    def gate(name)
      @gates.compute_if_absent(name) { Concurrent::Event.new }
    end

    def open(name)
      gate(name).set
    end

    # Lets every job still waiting finish, and forgets what happened.
    def reset!
      @gates.each_value(&:set)
      @gates = Concurrent::Map.new
      @mutex.synchronize { @events.clear }
    end
  end

  class ApplicationJob < ActiveJob::Base
    # Outermost (defined before LockManager::Worker's): "start", then "done", "skipped" (the lock let
    # nothing run) or "failed <error class>".
    around_perform do |job, block|
      AjAsync.running.increment
      AjAsync.record(job, "start")
      Thread.current[:aj_async_ran] = false
      block.call
      AjAsync.record(job, Thread.current[:aj_async_ran] ? "done" : "skipped")
    rescue Exception => e # rubocop:disable Lint/RescueException -- recorded, then raised on
      AjAsync.record(job, "failed #{e.class}")
      raise
    ensure
      AjAsync.running.decrement
    end

    def perform(label, hold = 0)
      Thread.current[:aj_async_ran] = true
      AjAsync.record(self, "working")
      hold.is_a?(String) ? AjAsync.gate(hold).wait(10) : sleep(hold)
      AjAsync.record(self, "finished #{label}")
    end
  end

  class NonblockingJob < ApplicationJob
    include LockManager::Worker
    lock_with :nonblocking
  end

  class OtherNonblockingJob < ApplicationJob
    include LockManager::Job
    lock_with :nonblocking
  end

  class RescheduleJob < ApplicationJob
    include LockManager::Worker
    lock_with :nonblocking, key: "held", on_conflict: :reschedule, reschedule_in: 1
  end

  class RaiseJob < ApplicationJob
    include LockManager::Worker
    lock_with :nonblocking, key: "held", on_conflict: :raise
    retry_on LockManager::LockNotAcquired, wait: 1, attempts: 10
  end

  class RaiseInlineJob < ApplicationJob
    include LockManager::Worker
    self.queue_adapter = :inline
    lock_with :nonblocking, key: "held", on_conflict: :raise
  end

  class BlockingJob < ApplicationJob
    include LockManager::Worker
    lock_with :blocking, key: "blocking", timeout: 10
  end

  class BlockingInlineJob < ApplicationJob
    include LockManager::Worker
    self.queue_adapter = :inline
    lock_with :blocking, key: "held", timeout: 1
  end

  class UserJob < ApplicationJob
    include LockManager::Worker
    lock_with :nonblocking, key: ->(user_id, *) { "user:#{user_id}" }
  end

  class UntilExecutingJob < ApplicationJob
    include LockManager::Worker
    lock_with :until_executing, unique_for: 30
  end

  class UntilExecutedJob < ApplicationJob
    include LockManager::Worker
    lock_with :until_executed, unique_for: 30
  end

  class OtherUntilExecutedJob < ApplicationJob
    include LockManager::Worker
    lock_with :until_executed, unique_for: 30
  end

  # Its key reads a Symbol: what perform_later was given, and what the job deserializes when it runs.
  class TierJob < ApplicationJob
    include LockManager::Worker
    lock_with :until_executed, key: ->(tier, *) { "tier:#{tier.inspect}" }, unique_for: 30
  end

  class WhileExecutingJob < ApplicationJob
    include LockManager::Worker
    lock_with :until_and_while_executing, unique_for: 30
  end

  class FailingJob < ApplicationJob
    include LockManager::Worker
    lock_with :until_executed, unique_for: 20

    def perform(_number)
      Thread.current[:aj_async_ran] = true
      AjAsync.record(self, "working")
      raise Boom, "failed"
    end
  end

  # Fails on its first execution; retry_on runs it again, with the same job_id.
  class RetriedJob < ApplicationJob
    include LockManager::Worker
    lock_with :until_executed, unique_for: 20
    retry_on Boom, wait: 1, attempts: 3

    def perform(_number)
      Thread.current[:aj_async_ran] = true
      AjAsync.record(self, "working")
      raise Boom, "first try" if executions == 1

      AjAsync.record(self, "finished")
    end
  end
end

RSpec.describe "ActiveJob with LockManager::Worker (:async adapter)" do
  include JobEvents

  before(:all) do
    @server = RedisServer.new.start
    @adapter = ActiveJob::QueueAdapters::AsyncAdapter.new(min_threads: 0, max_threads: 12)
    AjAsync::ApplicationJob.queue_adapter = @adapter
    @logger = ActiveJob::Base.logger
    @log = StringIO.new
    ActiveJob::Base.logger = ActiveSupport::TaggedLogging.new(Logger.new(@log))
  end

  after(:all) do
    AjAsync.reset!
    @adapter&.shutdown
    ActiveJob::Base.logger = @logger
    @server&.shutdown
    reset_lock_manager!
  end

  let(:admin) { @server.client }
  let(:elsewhere_on_server) { LockManager::Locker.new(redis_url: @server.url, key_prefix: prefix) }

  before { configure_shared_locker!(@server.url) }

  after do
    AjAsync.reset!
    eventually(timeout: 15, interval: 0.05) { AjAsync.running.value.zero? }
    admin.close
    reset_lock_manager!
  end

  def recorded(klass)
    AjAsync.events(klass)
  end

  def log
    @log.string
  end

  def keys
    held_keys(admin, "#{prefix}*").sort
  end

  def holder(key)
    LockManager.locker.holder(key)
  end

  # The until_* default key, computed here independently (docs/jobs.md): the class, and a digest of the
  # arguments as ActiveJob serializes them.
  def default_key(klass, args)
    "#{klass.name}:#{Digest::SHA256.hexdigest(JSON.generate(ActiveJob::Arguments.serialize(args)))[0, 32]}"
  end

  describe ":nonblocking" do
    it "on_conflict :skip: 5 jobs while the first works, the first runs, 4 are skipped and logged" do
      first = AjAsync::NonblockingJob.perform_later("first", "first")
      wait_for_job(first, "working")
      expect(keys).to eq(["#{prefix}AjAsync::NonblockingJob"]) # default key: the job's own class

      others = Array.new(4) { AjAsync::NonblockingJob.perform_later("other", 0) }
      expect(others).to all(be_a(AjAsync::NonblockingJob)) # enqueued: the lock is taken when a job runs
      wait_for(AjAsync::NonblockingJob, "skipped", 4)
      AjAsync.open("first")
      wait_for_job(first, "done")

      expect(events(AjAsync::NonblockingJob, "working").map { |e| e["jid"] }).to eq([first.job_id])
      expect(events(AjAsync::NonblockingJob, "skipped").map { |e| e["jid"] }).to match_array(others.map(&:job_id))
      others.each do |job|
        expect(log).to include("lock_manager: skipped AjAsync::NonblockingJob job_id=#{job.job_id}: " \
                               "lock \"AjAsync::NonblockingJob\" is held")
      end
      expect(keys).to eq([]) # released after success
    end

    it "on_conflict :reschedule: retry_job(wait: reschedule_in) until the lock is free, then the same job runs" do
      held = elsewhere_on_server.try_lock("held", timeout: 30)
      job = AjAsync::RescheduleJob.perform_later("later")
      tries = wait_for(AjAsync::RescheduleJob, "skipped", 2, timeout: 5)
      expect(events(AjAsync::RescheduleJob, "working")).to eq([])
      expect(tries[1]["at"] - tries[0]["at"]).to be >= 0.95 # reschedule_in: 1
      held.release

      ran = wait_for_job(job, "working", timeout: 5)
      wait_for_job(job, "done")
      expect(events(AjAsync::RescheduleJob).map { |e| e["jid"] }.uniq).to eq([job.job_id])
      expect(ran["executions"]).to be >= 3
      expect(events(AjAsync::RescheduleJob, "working").size).to eq(1)
      expect(keys).to eq([])
    end

    it "on_conflict :raise: LockNotAcquired, and retry_on runs the same job again until the lock is free" do
      held = elsewhere_on_server.try_lock("held", timeout: 30)
      job = AjAsync::RaiseJob.perform_later("retried")
      wait_for_job(job, "failed LockManager::LockNotAcquired")
      expect(events(AjAsync::RaiseJob, "working")).to eq([])
      held.release

      ran = wait_for_job(job, "working", timeout: 5)
      wait_for_job(job, "done")
      expect(ran["executions"]).to be >= 2
      expect(events(AjAsync::RaiseJob).map { |e| e["jid"] }.uniq).to eq([job.job_id])
      expect(keys).to eq([])
    end

    it "on_conflict :raise without retry_on: perform_later on :inline raises LockNotAcquired naming the key" do
      held = elsewhere_on_server.try_lock("held", timeout: 30)
      expect { AjAsync::RaiseInlineJob.perform_later("inline") }
        .to raise_error(LockManager::LockNotAcquired, /"held"/)
      expect(events(AjAsync::RaiseInlineJob, "working")).to eq([])
    ensure
      held&.release
    end

    it "key: a Proc over the job's arguments: users 1 and 2 in parallel, the second job for user 1 skipped" do
      one = AjAsync::UserJob.perform_later(1, "users")
      two = AjAsync::UserJob.perform_later(2, "users")
      wait_for_job(one, "working")
      wait_for_job(two, "working")
      expect(keys).to eq(["#{prefix}user:1", "#{prefix}user:2"])

      again = AjAsync::UserJob.perform_later(1, 0)
      wait_for_job(again, "skipped")
      expect(log).to include("skipped AjAsync::UserJob job_id=#{again.job_id}: lock \"user:1\" is held")
      AjAsync.open("users")
      wait_for(AjAsync::UserJob, "done", 2)

      expect(events(AjAsync::UserJob, "working").map { |e| e["jid"] }).to match_array([one.job_id, two.job_id])
      expect(Timeline.most_at_once(Timeline.work_intervals(events(AjAsync::UserJob), /finished/))).to eq(2)
      expect(keys).to eq([])
    end

    it "two ActiveJob classes with the same arguments never block each other (each keyed on its own class)" do
      one = AjAsync::NonblockingJob.perform_later("same", "same")
      two = AjAsync::OtherNonblockingJob.perform_later("same", "same")
      wait_for_job(one, "working")
      wait_for_job(two, "working")
      expect(keys).to eq(["#{prefix}AjAsync::NonblockingJob", "#{prefix}AjAsync::OtherNonblockingJob"])
      AjAsync.open("same")
      wait_for_job(one, "done")
      wait_for_job(two, "done")

      intervals = Timeline.work_intervals(AjAsync.events, /finished/)
      expect(Timeline.most_at_once(intervals)).to eq(2)
    end
  end

  describe ":blocking" do
    it "serializes: 3 jobs, all run, one after another" do
      jobs = Array.new(3) { |n| AjAsync::BlockingJob.perform_later("n#{n}", 0.3) }
      wait_for(AjAsync::BlockingJob, "done", 3)
      intervals = Timeline.work_intervals(events(AjAsync::BlockingJob), /finished/)

      expect(events(AjAsync::BlockingJob, "working").map { |e| e["jid"] }).to match_array(jobs.map(&:job_id))
      expect(intervals.size).to eq(3)
      expect(Timeline.most_at_once(intervals)).to eq(1)
      expect(keys).to eq([])
    end

    it "waits up to timeout, then raises LockNotAcquired (:inline shows it to the caller)" do
      held = elsewhere_on_server.try_lock("held", timeout: 30)
      error, took = timed_error(LockManager::LockNotAcquired) { AjAsync::BlockingInlineJob.perform_later("x") }

      expect(error.message).to include('"held"')
      expect(took).to be_between(0.9, 3)
      expect(events(AjAsync::BlockingInlineJob, "working")).to eq([])
    ensure
      held&.release
    end
  end

  describe ":until_executing" do
    it "refuses an enqueue while one is pending, releases the lock when the job starts" do
      args = %w[a until-executing]
      key = default_key(AjAsync::UntilExecutingJob, args)
      first = AjAsync::UntilExecutingJob.set(wait: 2).perform_later(*args)
      expect(first).to be_a(AjAsync::UntilExecutingJob)
      expect(holder(key)).to eq(first.job_id)
      expect(admin.pttl("#{prefix}#{key}")).to be_between(31_000, 32_000) # unique_for (30 s) past its scheduled time
      expect(AjAsync::UntilExecutingJob.perform_later(*args)).to be(false)

      wait_for_job(first, "working")
      expect(holder(key)).to be_nil # released as it starts: nothing held while it runs
      second = AjAsync::UntilExecutingJob.perform_later(*args)
      expect(second).to be_a(AjAsync::UntilExecutingJob)
      wait_for_job(second, "working")
      AjAsync.open("until-executing")
      wait_for(AjAsync::UntilExecutingJob, "done", 2)

      intervals = Timeline.work_intervals(events(AjAsync::UntilExecutingJob), /finished/)
      expect(Timeline.most_at_once(intervals)).to eq(2)
      expect(keys).to eq([])
    end
  end

  describe ":until_executed" do
    it "5 perform_later while one is pending or running: 1 enqueued, 4 false; after it finished a new one runs" do
      args = [7, "report"]
      key = default_key(AjAsync::UntilExecutedJob, args)
      results = Array.new(5) { AjAsync::UntilExecutedJob.perform_later(*args) }
      first = results.first

      expect(first).to be_a(AjAsync::UntilExecutedJob)
      expect(first.successfully_enqueued?).to be(true)
      expect(results.drop(1)).to eq([false] * 4)
      wait_for_job(first, "working")
      expect(holder(key)).to eq(first.job_id) # held by its job_id while it runs
      expect(keys).to eq(["#{prefix}#{key}"])

      refused = AjAsync::UntilExecutedJob.new(*args)
      expect(refused.enqueue).to be(false)
      expect(refused.successfully_enqueued?).to be(false)
      expect(log).to include("lock_manager: refused AjAsync::UntilExecutedJob job_id=#{refused.job_id}: " \
                             "lock \"#{key}\" is held by #{first.job_id}")
      expect(log.scan(/refused AjAsync::UntilExecutedJob job_id=\S+: lock "#{key}" is held by #{first.job_id}/).size)
        .to eq(5)

      AjAsync.open("report")
      wait_for_job(first, "done")
      expect(keys).to eq([]) # released after success
      again = AjAsync::UntilExecutedJob.perform_later(*args)
      expect(again).to be_a(AjAsync::UntilExecutedJob)
      expect(again.successfully_enqueued?).to be(true)
      wait_for_job(again, "done")

      expect(events(AjAsync::UntilExecutedJob, "working").map { |e| e["jid"] }).to eq([first.job_id, again.job_id])
      expect(keys).to eq([])
    end

    it "default keys differ by arguments and by class: neither refuses the other" do
      a1 = AjAsync::UntilExecutedJob.perform_later(1, "defaults")
      a2 = AjAsync::UntilExecutedJob.perform_later(2, "defaults")
      b1 = AjAsync::OtherUntilExecutedJob.perform_later(1, "defaults")
      expect([a1, a2, b1]).to all(be_a(AjAsync::ApplicationJob))
      [a1, a2, b1].each { |job| wait_for_job(job, "working") }

      expected = [[AjAsync::UntilExecutedJob, [1, "defaults"]], [AjAsync::UntilExecutedJob, [2, "defaults"]],
                  [AjAsync::OtherUntilExecutedJob, [1, "defaults"]]]
      expect(keys).to eq(expected.map { |klass, args| "#{prefix}#{default_key(klass, args)}" }.sort)
      expect([a1, a2, b1].map { |job| holder(default_key(job.class, job.arguments)) }).to eq([a1, a2, b1].map(&:job_id))
      AjAsync.open("defaults")
      [a1, a2, b1].each { |job| wait_for_job(job, "done") }
      expect(Timeline.most_at_once(Timeline.work_intervals(AjAsync.events, /finished/))).to eq(3)
    end

    it "a Proc key gets the deserialized arguments: the lock claimed at enqueue is the one the job runs under" do
      job = AjAsync::TierJob.perform_later(:gold, "tier")
      expect(job).to be_a(AjAsync::TierJob)
      expect(AjAsync::TierJob.perform_later(:gold, 0)).to be(false)
      wait_for_job(job, "working")
      expect(keys).to eq(["#{prefix}tier::gold"])
      expect(holder("tier::gold")).to eq(job.job_id)

      AjAsync.open("tier")
      wait_for_job(job, "done")
      expect(keys).to eq([])
      expect(AjAsync::TierJob.perform_later(:gold, 0)).to be_a(AjAsync::TierJob)
    end

    it "a job that fails keeps its lock, held by its job_id, for at most unique_for" do
      job = AjAsync::FailingJob.perform_later(5)
      wait_for_job(job, "failed AjAsync::Boom")
      key = default_key(AjAsync::FailingJob, [5])

      expect(holder(key)).to eq(job.job_id)
      expect(admin.pttl("#{prefix}#{key}")).to be_between(15_000, 20_000) # unique_for: 20
      expect(AjAsync::FailingJob.perform_later(5)).to be(false)
    end

    it "retry_on enqueues the same job_id again: it keeps the lock, others are refused, success releases it" do
      job = AjAsync::RetriedJob.perform_later(6)
      wait_for_job(job, "failed AjAsync::Boom")
      key = default_key(AjAsync::RetriedJob, [6])
      expect(holder(key)).to eq(job.job_id)
      expect(AjAsync::RetriedJob.perform_later(6)).to be(false)

      wait_for_job(job, "done", timeout: 5)
      runs = events(AjAsync::RetriedJob, "working")
      expect(runs.map { |e| [e["jid"], e["executions"]] }).to eq([[job.job_id, 1], [job.job_id, 2]])
      expect(log).not_to include("refused AjAsync::RetriedJob job_id=#{job.job_id}")
      expect(keys).to eq([])
    end
  end

  describe ":until_and_while_executing" do
    it "refused while pending; when it starts, the enqueue lock goes and the run lock \"key:run\" holds" do
      args = [3, "while"]
      key = default_key(AjAsync::WhileExecutingJob, args)
      first = AjAsync::WhileExecutingJob.set(wait: 2).perform_later(*args)
      expect(first).to be_a(AjAsync::WhileExecutingJob)
      expect(holder(key)).to eq(first.job_id)
      expect(AjAsync::WhileExecutingJob.perform_later(*args)).to be(false)

      wait_for_job(first, "working")
      expect(keys).to eq(["#{prefix}#{key}:run"])
      second = AjAsync::WhileExecutingJob.perform_later(*args) # accepted: the first is no longer pending
      expect(second).to be_a(AjAsync::WhileExecutingJob)
      wait_for_job(second, "skipped") # ...but it finds the first running
      expect(log).to include("skipped AjAsync::WhileExecutingJob job_id=#{second.job_id}: lock \"#{key}:run\" is held")

      AjAsync.open("while")
      wait_for_job(first, "done")
      expect(events(AjAsync::WhileExecutingJob, "working").map { |e| e["jid"] }).to eq([first.job_id])
      expect(keys).to eq([])
    end
  end

  describe "the :test adapter (apps using ActiveJob::TestHelper)" do
    it "refuses a duplicate enqueue; performing the enqueued job releases its lock" do
      adapter = ActiveJob::QueueAdapters::TestAdapter.new
      klass = stub_const("AjAsync::TestAdapterJob", Class.new(AjAsync::ApplicationJob) do
        include LockManager::Worker
        lock_with :until_executed, unique_for: 30
      end)
      klass.queue_adapter = adapter
      key = default_key(klass, ["test", 0])

      first = klass.perform_later("test", 0)
      expect(first).to be_a(klass)
      expect(klass.perform_later("test", 0)).to be(false)
      expect(adapter.enqueued_jobs.size).to eq(1)
      expect(holder(key)).to eq(first.job_id)

      ActiveJob::Base.execute(adapter.enqueued_jobs.first) # what perform_enqueued_jobs does

      expect(events(klass, "finished test").map { |e| e["jid"] }).to eq([first.job_id])
      expect(holder(key)).to be_nil
      expect(klass.perform_later("test", 0)).to be_a(klass)
    end
  end
end
