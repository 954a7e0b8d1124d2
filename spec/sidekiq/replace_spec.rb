# frozen_string_literal: true

require "spec_helper"
require "active_job"
require "json"
require_relative "../support/sidekiq_client"
require "lock_manager/worker"

# on_conflict: :replace: a push of a job whose key another job holds while that job is still
# pending (in its queue or the schedule) replaces it, in the push's own script: the pending job is
# taken out and the new one pushed with the lock. A job that started is never replaced. Sidekiq's
# client on a private redis-server (the locks' Redis too, so the claim travels with the push).
module ReplacingJobs
  class Sync
    include LockManager::Worker
    lock_with :until_executed, key: ->(account, *) { "sync:#{account}" }, unique_for: 600, on_conflict: :replace

    def perform(*); end
  end

  class Notify
    include LockManager::Worker
    lock_with :until_executing, key: ->(account, *) { "notify:#{account}" }, unique_for: 600, on_conflict: :replace

    def perform(*); end
  end
end

RSpec.describe "on_conflict: :replace" do
  before(:all) { @server = RedisServer.new.start }
  after(:all) { @server&.shutdown }

  include_context "a Sidekiq client of its own"

  let(:prefix) { "replace:#{SecureRandom.hex(4)}:" }

  before do
    use_locks(prefix)
    admin.del("queue:default", "schedule")
  end

  def queued
    admin.lrange("queue:default", 0, -1).map { |json| JSON.parse(json) }
  end

  def holder(key)
    admin.get("#{prefix}#{key}")
  end

  it "replaces the pending job of the key: the newest push is the one in the queue, holding the lock" do
    first = ReplacingJobs::Sync.perform_async(7, "old")
    second = ReplacingJobs::Sync.perform_async(7, "new")
    third = ReplacingJobs::Sync.perform_async(8, "other")

    expect([first, second, third]).to all(be_a(String))
    expect(queued.map do |job|
             [job["jid"], job["args"]]
           end).to contain_exactly([second, [7, "new"]], [third, [8, "other"]])
    expect([holder("sync:7"), holder("sync:8")]).to eq([second, third])
    expect(@client_log.string).to include(%(replaced ReplacingJobs::Sync jid=#{first} by jid=#{second}: lock "sync:7"))
  end

  it "replaces a scheduled job in the schedule" do
    first = ReplacingJobs::Sync.perform_in(600, 9, "old")
    second = ReplacingJobs::Sync.perform_in(300, 9, "new")

    expect(admin.zrange("schedule", 0, -1).map { |json| JSON.parse(json)["jid"] }).to eq([second])
    expect(holder("sync:9")).to eq(second)
    expect(first).not_to eq(second)
  end

  it "never replaces a job that started: a push while it runs is refused" do
    first = ReplacingJobs::Sync.perform_async(10, "running")
    running = JSON.parse(admin.rpop("queue:default")) # Sidekiq's fetch took it
    LockManager::Sidekiq::ServerMiddleware.new.call(ReplacingJobs::Sync.new, running, "default") do
      expect(ReplacingJobs::Sync.perform_async(10, "new")).to be_nil
      expect(holder("sync:10")).to eq(first)
    end
    expect(ReplacingJobs::Sync.perform_async(10, "after")).to be_a(String) # released when it ended
  end

  it "replaces a pending :until_executing job; once it started, its lock is free for the next push anyway" do
    first = ReplacingJobs::Notify.perform_async(11)
    second = ReplacingJobs::Notify.perform_async(11)
    expect(queued.map { |job| job["jid"] }).to eq([second])
    expect(first).not_to eq(second)
  end

  it "is for :until_executing and :until_executed, and for Sidekiq jobs: ArgumentError at lock_with otherwise" do
    expect { Class.new { include LockManager::Worker }.lock_with(:nonblocking, on_conflict: :replace) }
      .to raise_error(ArgumentError, /:replace is for :until_executing and :until_executed/)
    active_job = Class.new(ActiveJob::Base) { include LockManager::Worker }
    expect { active_job.lock_with(:until_executed, unique_for: 60, on_conflict: :replace) }
      .to raise_error(ArgumentError, /:replace is for Sidekiq jobs/)
  end
end
