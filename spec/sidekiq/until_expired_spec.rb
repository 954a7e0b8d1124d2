# frozen_string_literal: true

require "spec_helper"
require "active_job"
require "logger"
require "sidekiq/api"
require_relative "../support/sidekiq_client"
require "lock_manager/worker"

# lock_with :until_expired: the lock taken at push lives unique_for whatever the job does, and a push
# of the same job again (a retry, a scheduled job come due) keeps its expiry. Sidekiq's client and
# ActiveJob's :test adapter on a private redis-server; the run through the server middleware.
module ExpiringJobs
  class Digest
    include LockManager::Worker
    lock_with :until_expired, key: ->(user_id, *) { "digest:#{user_id}" }, unique_for: 10

    def perform(*); end
  end

  class Failing
    include LockManager::Worker
    lock_with :until_expired, key: "failing", unique_for: 10

    def perform
      raise "failed"
    end
  end

  class ActiveDigest < ActiveJob::Base
    include LockManager::Worker
    self.queue_adapter = :test
    self.logger = Logger.new(File::NULL)
    lock_with :until_expired, key: ->(user_id) { "active-digest:#{user_id}" }, unique_for: 10

    def perform(_user_id); end
  end
end

RSpec.describe "lock_with :until_expired" do
  before(:all) { @server = RedisServer.new.start }
  after(:all) { @server&.shutdown }

  include_context "a Sidekiq client of its own"

  let(:prefix) { "expiring:#{SecureRandom.hex(4)}:" }

  before { use_locks(prefix) }

  def pttl(key)
    admin.pttl("#{prefix}#{key}")
  end

  def payload_of(jid)
    admin.lrange("queue:default", 0, -1).map { |json| JSON.parse(json) }.find { |job| job["jid"] == jid }
  end

  it "refuses the same key for unique_for from the push, however the job ends" do
    jid = ExpiringJobs::Digest.perform_async(7)
    expect(ExpiringJobs::Digest.perform_async(7)).to be_nil
    expect(pttl("digest:7")).to be_between(9_000, 10_000)

    LockManager::Sidekiq::ServerMiddleware.new.call(ExpiringJobs::Digest.new, payload_of(jid), "default") { :ran }
    expect(admin.get("#{prefix}digest:7")).to eq(jid) # not released by the run
    expect { run_failing }.to raise_error(RuntimeError, "failed")
    expect(admin.get("#{prefix}failing")).not_to be_nil # nor by a failure
  end

  def run_failing
    jid = ExpiringJobs::Failing.perform_async
    LockManager::Sidekiq::ServerMiddleware.new.call(ExpiringJobs::Failing.new, payload_of(jid), "default") do
      ExpiringJobs::Failing.new.perform
    end
  end

  it "keeps the expiry of the first push when the job is pushed again (a retry, a scheduled job come due)" do
    jid = ExpiringJobs::Digest.perform_async(8)
    payload = payload_of(jid)
    expires_at = payload.fetch("lock_manager_expires_at")
    expect(expires_at).to be_within(1).of(Time.now.to_f + 10)
    sleep 1

    again = Sidekiq::Client.push(payload.except("enqueued_at")) # Sidekiq's own push of a retry: the same jid
    expect(again).to eq(jid)
    expect(pttl("digest:8")).to be <= 9_100 # not 10 s again
    expect(payload_of(jid)["lock_manager_expires_at"]).to eq(expires_at)
  end

  it "keeps the lock when the job is deleted, killed or cleared through Sidekiq's API" do
    jid = ExpiringJobs::Digest.perform_async(10)
    LockManager::Sidekiq::RemovedJobs.release([payload_of(jid)]) # what every removal runs

    expect(admin.get("#{prefix}digest:10")).to eq(jid)
  end

  it "takes no lock for a push after the lock expired, and refuses nothing for it" do
    expired = { "class" => ExpiringJobs::Digest.name, "args" => [9], "jid" => SecureRandom.hex(12),
                "lock_manager_expires_at" => Time.now.to_f - 1 }
    holder = LockManager.locker.claim(["digest:9"], ["another-jid"], [30])

    expect(holder.first).to be_a(Integer)
    expect(Sidekiq::Client.push(expired)).to eq(expired["jid"]) # pushed, without a lock
    expect(admin.get("#{prefix}digest:9")).to eq("another-jid") # whoever holds the key keeps it
  end

  it "works the same for an ActiveJob class: its serialized data carries the expiry" do
    job = ExpiringJobs::ActiveDigest.perform_later(7)
    expect(job.successfully_enqueued?).to be(true)
    expect(ExpiringJobs::ActiveDigest.perform_later(7)).to be(false)
    data = job.serialize
    expect(data["lock_manager_expires_at"]).to be_within(1).of(Time.now.to_f + 10)

    ExpiringJobs::ActiveDigest.execute(data) # runs: the lock stays
    expect(admin.get("#{prefix}active-digest:7")).to eq(job.job_id)
    sleep 1
    again = ActiveJob::Base.deserialize(data)
    again.send(:deserialize_arguments_if_needed) # as in a job that retries itself (retry_on, retry_job)
    again.enqueue # the same job_id, the same expiry
    expect(pttl("active-digest:7")).to be <= 9_100
  end

  it "refuses on_conflict for :until_expired (it takes no lock when the job runs)" do
    expect { Class.new { include LockManager::Worker }.lock_with(:until_expired, unique_for: 5, on_conflict: :skip) }
      .to raise_error(ArgumentError, /on_conflict is not for :until_expired/)
  end
end
