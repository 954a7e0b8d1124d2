# frozen_string_literal: true

require "spec_helper"
require "active_job"
require "logger"
require_relative "../support/sidekiq_client"
require "lock_manager/worker"
require "lock_manager/admin"

# `SyncUserJob.unlock(7)` and Admin#release_job: the lock a job's arguments would take, released
# whoever holds it, for Sidekiq and ActiveJob classes, pushed through Sidekiq's client on a private
# redis-server.
module UnlockJobs
  class UntilExecutedJob
    include LockManager::Worker
    lock_with :until_executed, unique_for: 600

    def perform(*); end
  end

  class KeyedJob
    include LockManager::Worker
    lock_with :until_and_while_executing, key: ->(user_id, *) { "sync:#{user_id}" }, unique_for: 600

    def perform(*); end
  end

  class PlainJob
    include Sidekiq::Worker if defined?(Sidekiq::Worker)

    def perform(*); end
  end

  class ActiveJobExport < ActiveJob::Base
    include LockManager::Worker
    self.queue_adapter = :test
    self.logger = Logger.new(File::NULL)
    lock_with :until_executed, unique_for: 600

    def perform(*); end
  end
end

RSpec.describe "Unlocking a job's lock by its arguments" do
  before(:all) { @server = RedisServer.new.start }
  after(:all) { @server&.shutdown }

  include_context "a Sidekiq client of its own"

  let(:prefix) { "unlock:#{SecureRandom.hex(4)}:" }

  before { use_locks(prefix) }

  def held_by(key)
    admin.get("#{prefix}#{key}")
  end

  it "releases a pending unique job's lock, so the same arguments can be pushed again" do
    jid = UnlockJobs::UntilExecutedJob.perform_async(7, "x" => 1)
    expect(UnlockJobs::UntilExecutedJob.perform_async(7, "x" => 1)).to be_nil

    expect(UnlockJobs::UntilExecutedJob.unlock(8, "x" => 1)).to be(false) # other arguments: no lock
    expect(UnlockJobs::UntilExecutedJob.unlock(7, x: 1)).to be(true) # as Sidekiq's JSON carries them
    expect(UnlockJobs::UntilExecutedJob.unlock(7, "x" => 1)).to be(false)
    again = UnlockJobs::UntilExecutedJob.perform_async(7, "x" => 1)
    expect(again).to be_a(String)
    expect(again).not_to eq(jid)
  end

  it "releases both locks of :until_and_while_executing, under its key Proc, and nothing else" do
    UnlockJobs::KeyedJob.perform_async(7)
    UnlockJobs::KeyedJob.perform_async(8)
    LockManager.locker.claim(["sync:7:run"], ["running-jid"], [60]) # its run lock, as a running job holds it

    expect(LockManager::Admin.new.release_job(UnlockJobs::KeyedJob, [7])).to be(true)
    expect([held_by("sync:7"), held_by("sync:7:run")]).to eq([nil, nil])
    expect(held_by("sync:8")).to be_a(String)
  end

  it "releases an ActiveJob class's lock, its arguments as ActiveJob serializes them" do
    job = UnlockJobs::ActiveJobExport.perform_later(7, :csv)
    expect(held_by(UnlockJobs::ActiveJobExport.lock_manager_lock_for([7, :csv]).key)).to eq(job.job_id)

    expect(UnlockJobs::ActiveJobExport.unlock(7, :csv)).to be(true)
    expect(UnlockJobs::ActiveJobExport.perform_later(7, :csv).successfully_enqueued?).to be(true)
  end

  it "refuses a class without lock_with, and arguments that are not an Array, before Redis" do
    admin_api = LockManager::Admin.new
    expect { admin_api.release_job(UnlockJobs::PlainJob, [7]) }.to raise_error(ArgumentError, /has no lock_with/)
    expect { admin_api.release_job(UnlockJobs::UntilExecutedJob, 7) }.to raise_error(ArgumentError, /an Array/)
  end
end
