# frozen_string_literal: true

require "spec_helper"
require "sidekiq"
require "lock_manager/admin"
require_relative "../support/process_helpers"
require_relative "../support/unique_jobs"

# A unique job whose lock was claimed but whose push could not be written (Sidekiq's Redis down) leaves no
# lock behind: a single push's claim travels with the job to the write (FailedPush), a bulk's are its own.
RSpec.describe "Sidekiq pushes that fail after their claim" do
  before(:all) do
    @server = RedisServer.new.start
    @down = Sidekiq::RedisConnection.create(url: "redis://127.0.0.1:#{FreePort.pick}/0", size: 1) # nothing listens
  end

  after(:all) do
    @down&.shutdown(&:close)
    @server&.shutdown
  end

  around { |example| Sidekiq::Client.via(@down) { example.run } }

  before { configure_shared_locker!(@server.url) }

  # What the push sent the locks' Redis (MONITOR), and the locks left there.
  def pushed
    monitor = ProcessHelpers::Monitor.new(@server.port)
    error = begin
      yield
      nil
    rescue StandardError => e
      e
    end
    commands = monitor.stop.map(&:last)
    [error, commands, LockManager::Admin.new.locks("UniqueJobs::*")]
  end

  it "a single push: the claim taken for it is released when the job cannot be written" do
    error, commands, locks = pushed { UniqueJobs::UntilExecutedJob.perform_async(rand(1 << 30)) }

    expect(error&.message).to match(/connect|refused/i)
    expect(commands.grep(/UniqueJobs::UntilExecutedJob:/).size).to be >= 2 # the claim, then its release
    expect(locks).to eq([])
  end

  it "a bulk push: every claim of the bulk is released when its jobs cannot be written" do
    base = rand(1 << 30)
    items = { "class" => UniqueJobs::BulkJob, "args" => [[base], [base + 1]] }
    error, commands, locks = pushed { Sidekiq::Client.push_bulk(items) }

    expect(error&.message).to match(/connect|refused/i)
    expect(commands.grep(/UniqueJobs::BulkJob:/).size).to be >= 2
    expect(locks).to eq([])
  end
end
