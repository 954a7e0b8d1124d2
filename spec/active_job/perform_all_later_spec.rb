# frozen_string_literal: true

require "spec_helper"
require "active_job"
require "digest"
require "json"
require "logger"
require "stringio"
require "sidekiq"
require_relative "../support/slow_link"

# ActiveJob.perform_all_later (ActiveJob 7.1+, so the modern stack) with unique jobs, on the Sidekiq adapter
# (in this process, pushing to the suite's Redis) and on ActiveJob's own :test, :async and :inline. The gem's
# Locker talks to Redis through a SlowLink, which counts its round trips.
module AjBulk
  @started = []

  class << self
    # link.round_trips as each job started (:inline runs them as they are pushed).
    attr_reader :started
    attr_accessor :link
  end

  class ApplicationJob < ActiveJob::Base
    queue_as :aj_bulk
    before_perform { AjBulk.started << AjBulk.link&.round_trips } # before the lock's own callbacks

    def perform(*); end
  end

  class ReportJob < ApplicationJob
    include LockManager::Worker
    lock_with :until_executed, unique_for: 60
  end

  class SyncJob < ApplicationJob
    include LockManager::Worker
    lock_with :until_executing, key: ->(id) { "sync:#{id}" }, unique_for: 60
  end

  class NonblockingJob < ApplicationJob
    include LockManager::Worker
    lock_with :nonblocking
  end

  class PlainJob < ApplicationJob; end

  # Refuses the job whose argument is "refused" (ActiveJob::EnqueueError: ActiveJob goes on with the others).
  class RefusingAdapter < ActiveJob::QueueAdapters::TestAdapter
    def enqueue(job)
      raise ActiveJob::EnqueueError, "no room" if job.arguments == ["refused"]

      super
    end
  end
end

RSpec.describe "ActiveJob.perform_all_later with unique jobs" do
  before(:all) do
    @logger = ActiveJob::Base.logger
    @log = StringIO.new
    ActiveJob::Base.logger = ActiveSupport::TaggedLogging.new(Logger.new(@log))
  end

  after(:all) { ActiveJob::Base.logger = @logger }

  before do
    skip "perform_all_later is ActiveJob 7.1's" unless ActiveJob.respond_to?(:perform_all_later)
    @link = AjBulk.link = SlowLink.new(URI(redis_url).port)
    LockManager.configure do |c|
      c.redis_url = @link.url
      c.key_prefix = prefix
    end
    # Through the link before it counts: the pooled connection is opened and the claim script loaded.
    LockManager.locker.claim(["warm-up"], ["warm-up"], [1])
    LockManager.locker.release_claim("warm-up", "warm-up")
    AjBulk.started.clear
  end

  after do
    AjBulk::ApplicationJob.queue_adapter = :async
    AjBulk.link = nil
    @link&.close
  end

  let(:link) { @link }

  def use(adapter)
    AjBulk::ApplicationJob.queue_adapter = adapter
    adapter
  end

  def default_key(klass, args)
    "#{klass.name}:#{Digest::SHA256.hexdigest(JSON.generate(ActiveJob::Arguments.serialize(args)))[0, 32]}"
  end

  def holder(key)
    elsewhere.holder(key)
  end

  # The perform_all_later, and the round trips of the gem's Locker during it (replies held back 0.3 s, so
  # that a pipeline counts once).
  def perform_all_later(jobs)
    link.slow_down(0.3)
    ActiveJob.perform_all_later(jobs)
    link.round_trips
  end

  # 600 ReportJobs (60 repeated, 20 whose key another holds) and 400 SyncJobs (100 repeated); jobs of other
  # classes between them.
  def mixed_jobs(base)
    locked = (0...20).map { |n| [base + 1_000 + n] }
    elsewhere.claim(locked.map { |args| default_key(AjBulk::ReportJob, args) }, ["someone-else"] * 20, [60] * 20)
    reports = ((0...520).map { |n| [base + n] } + (0...60).map { |n| [base + n] } + locked)
              .map { |args| AjBulk::ReportJob.new(*args) }
    syncs = ((0...300).to_a + (0...100).to_a).map { |n| AjBulk::SyncJob.new(base + n) }
    others = [AjBulk::PlainJob.new(1), AjBulk::NonblockingJob.new(2)]
    (reports + syncs + others).shuffle(random: Random.new(3))
  end

  # What each job should have become: the first of each key pushed, unless another holds it.
  def expected(jobs)
    seen = {}
    jobs.to_h do |job|
      key = job.respond_to?(:lock_manager_enqueue_lock) && job.lock_manager_enqueue_lock&.key
      next [job, true] unless key

      first = !seen.key?(key) && !holder(key)
      seen[key] = true
      [job, first]
    end
  end

  it "on the Sidekiq adapter: 1,000 unique jobs of two classes claimed in one round trip, duplicates and " \
     "held ones dropped, successfully_enqueued? set on every job" do
    require "active_job/queue_adapters/sidekiq_adapter"
    Sidekiq.configure_client { |config| config.redis = { url: redis_url } }
    use(ActiveJob::QueueAdapters::SidekiqAdapter.new)
    redis.del("queue:aj_bulk")
    jobs = mixed_jobs(rand(1_000_000) * 10_000)
    outcome = expected(jobs)

    expect(perform_all_later(jobs)).to eq(1)

    expect(jobs.to_h { |job| [job, job.successfully_enqueued?] }).to eq(outcome)
    pushed = outcome.select { |_, ok| ok }.keys
    queued = redis.lrange("queue:aj_bulk", 0, -1).map { |json| JSON.parse(json)["args"].first["job_id"] }
    expect(queued).to match_array(pushed.map(&:job_id))
    unique = pushed.select { |job| job.respond_to?(:lock_manager_enqueue_lock) && job.lock_manager_enqueue_lock }
    expect(unique.size).to eq(520 + 300)
    expect(unique.map { |job| holder(job.lock_manager_enqueue_lock.key) }).to eq(unique.map(&:job_id))
    refused = outcome.reject { |_, ok| ok }.keys
    expect(refused.size).to eq(60 + 20 + 100)
    refused.each do |job|
      expect(@log.string).to include("lock_manager: refused #{job.class.name} job_id=#{job.job_id}: lock ")
    end
  ensure
    redis.del("queue:aj_bulk")
  end

  it "on :test: one round trip per 1,000 unique jobs, the duplicates dropped" do
    adapter = use(ActiveJob::QueueAdapters::TestAdapter.new)
    base = rand(1_000_000) * 10_000
    jobs = ((0...1_100).to_a + (0...50).to_a).map { |n| AjBulk::ReportJob.new(base + n) }

    expect(perform_all_later(jobs)).to eq(2)

    expect(jobs.map(&:successfully_enqueued?)).to eq(([true] * 1_100) + ([false] * 50))
    expect(adapter.enqueued_jobs.map { |job| job["job_id"] }).to eq(jobs.first(1_100).map(&:job_id))
    expect(holder(default_key(AjBulk::ReportJob, [base]))).to eq(jobs.first.job_id)
  end

  it "on :async, scheduled jobs: their locks live unique_for past their scheduled time" do
    adapter = use(ActiveJob::QueueAdapters::AsyncAdapter.new)
    base = rand(1_000_000) * 10_000
    jobs = [0, 1, 0].map { |n| AjBulk::SyncJob.new(base + n).set(wait: 60) }

    expect(perform_all_later(jobs)).to eq(1)

    expect(jobs.map(&:successfully_enqueued?)).to eq([true, true, false])
    expect(redis.pttl("#{prefix}sync:#{base}")).to be_between(119_000, 120_000)
    expect(holder("sync:#{base + 1}")).to eq(jobs[1].job_id)
  ensure
    adapter&.shutdown
  end

  it "on :inline: the locks are claimed before the first job runs, in one round trip" do
    use(:inline)
    base = rand(1_000_000) * 10_000
    jobs = [0, 1, 0, 2].map { |n| AjBulk::ReportJob.new(base + n) }

    perform_all_later(jobs)

    expect(AjBulk.started.size).to eq(3)
    expect(AjBulk.started.first).to eq(1) # the claims' round trip, and nothing else yet
    expect(jobs.map(&:successfully_enqueued?)).to eq([true, true, false, true])
    expect([0, 1, 2].map { |n| holder(default_key(AjBulk::ReportJob, [base + n])) }).to eq([nil] * 3) # ran
  end

  it "a job the adapter does not take leaves no lock; the others keep theirs" do
    use(AjBulk::RefusingAdapter.new)
    jobs = [AjBulk::ReportJob.new("kept"), AjBulk::ReportJob.new("refused")]

    ActiveJob.perform_all_later(jobs)

    expect(jobs.map(&:successfully_enqueued?)).to eq([true, false])
    expect(jobs.last.enqueue_error).to be_a(ActiveJob::EnqueueError)
    expect(holder(default_key(AjBulk::ReportJob, ["kept"]))).to eq(jobs.first.job_id)
    expect(holder(default_key(AjBulk::ReportJob, ["refused"]))).to be_nil
  end
end
