# frozen_string_literal: true

require "spec_helper"
require "active_job"
require "logger"
require "stringio"

# ActiveJob classes run by the :inline adapter while their Redis is down.
module DownJobs
  @ran = Queue.new
  singleton_class.attr_reader :ran

  class Unique < ActiveJob::Base
    include LockManager::Worker
    lock_with :until_executed, unique_for: 60

    def perform(id)
      DownJobs.ran << [:unique, id]
    end
  end

  class Plain < ActiveJob::Base
    include LockManager::Worker
    lock_with :nonblocking, key: "down:plain"

    def perform
      DownJobs.ran << :plain
    end
  end
end

RSpec.describe "on_redis_error: Redis unreachable when a lock is asked for" do
  # A redis-server that was started, then stopped: its port refuses connections at once.
  let(:down_url) { RedisServer.new.start.tap(&:stop).url }
  let(:log) { StringIO.new }

  before { LockManager.configure { |c| c.logger = Logger.new(log) } }

  after { LockManager.configure { |c| c.logger = Logger.new($stderr, level: Logger::WARN) } }

  def down_locker(on_redis_error)
    LockManager::Locker.new(redis_url: down_url, on_redis_error: on_redis_error, connect_timeout: 0.2)
  end

  it "is :raise unless told otherwise: ConnectionError naming the key, the block not run" do
    expect(LockManager.config.on_redis_error).to eq(:raise)
    expect { down_locker(:raise).nonblocking_lock("k") { raise "not run" } }
      .to raise_error(LockManager::ConnectionError, /lock "k": cannot talk to Redis/)
  end

  it ":run runs the block without the lock and warns, naming the key and the setting" do
    result = down_locker(:run).nonblocking_lock("k") { |r| [:ran, r.fencing_token] }

    expect(result).to have_attributes(run?: true, result: [:ran, nil], fencing_token: nil, lost?: false)
    expect(log.string)
      .to match(/WARN.*lock "k": cannot talk to Redis.*running without the lock "k" \(on_redis_error: :run\)/)
    expect(down_locker(:run).blocking_lock("k", wait: 0.2) { :ran_too }).to eq(:ran_too)
  end

  it ":skip acts as if the lock were taken: nonblocking_lock skips the block, blocking_lock raises LockNotAcquired" do
    expect(down_locker(:skip).nonblocking_lock("k") { raise "not run" }.run?).to be(false)
    expect { down_locker(:skip).blocking_lock("k", wait: 0.2) { raise "not run" } }
      .to raise_error(LockManager::LockNotAcquired, /"k" was not acquired: Redis could not be reached/) { |error|
        expect(error.cause).to be_a(LockManager::ConnectionError)
        expect(error.key).to eq("k")
      }
    expect(log.string).to include('treating "k" as taken (on_redis_error: :skip)')
  end

  it "a call can choose for itself, and a bad value is an ArgumentError before Redis is asked" do
    expect(down_locker(:raise).nonblocking_lock("k", on_redis_error: :run) { :ran }.result).to eq(:ran)
    expect { down_locker(:raise).nonblocking_lock("k", on_redis_error: :ignore) {} }
      .to raise_error(ArgumentError, /on_redis_error must be :raise, :run or :skip, got :ignore/)
    expect { LockManager.configure { |c| c.on_redis_error = "run" } }.to raise_error(ArgumentError, /on_redis_error/)
  end

  it "an error of the block itself is never taken for Redis's" do
    up = new_locker(on_redis_error: :run)
    expect { up.nonblocking_lock("k") { raise LockManager::ConnectionError, "the block's own" } }
      .to raise_error(LockManager::ConnectionError, "the block's own")
    expect(up.locked?("k")).to be(false)
  end

  describe "jobs (ActiveJob, :inline adapter)" do
    before do
      [DownJobs::Unique, DownJobs::Plain].each { |job| job.queue_adapter = :inline } # other specs use Sidekiq's
      @logger = ActiveJob::Base.logger
      ActiveJob::Base.logger = Logger.new(nil)
      DownJobs.ran.clear
    end

    after do
      ActiveJob::Base.logger = @logger
      LockManager.configure { |c| c.redis_url = redis_url }
    end

    def with_setting(value)
      LockManager.configure do |c|
        c.redis_url = down_url
        c.on_redis_error = value
        c.connect_timeout = 0.2
      end
      yield
    ensure
      LockManager.configure do |c|
        c.on_redis_error = :raise
        c.connect_timeout = 1.0
      end
    end

    it ":run pushes and runs them without their locks" do
      with_setting(:run) do
        expect(DownJobs::Unique.perform_later(1)).to be_truthy
        DownJobs::Plain.perform_later
      end
      expect([DownJobs.ran.pop, DownJobs.ran.pop]).to eq([[:unique, 1], :plain])
    end

    it ":skip refuses the push of a unique job and skips a locked one" do
      with_setting(:skip) do
        expect(DownJobs::Unique.perform_later(2)).to be(false)
        DownJobs::Plain.perform_later
      end
      expect(DownJobs.ran.size).to eq(0)
      expect(log.string).to include("(on_redis_error: :skip)")
    end

    it ":raise fails the push" do
      with_setting(:raise) do
        expect { DownJobs::Unique.perform_later(3) }.to raise_error(LockManager::ConnectionError)
      end
      expect(DownJobs.ran.size).to eq(0)
    end
  end
end
