# frozen_string_literal: true

require "spec_helper"
require "active_job"
require "active_support/notifications"
require "logger"

# ActiveJob classes for the conflict events, run by the :test adapter (enqueue only) and :inline.
module EventJobs
  class Unique < ActiveJob::Base
    include LockManager::Worker
    lock_with :until_executed, unique_for: 60

    def perform(id); end
  end

  class Skipping < ActiveJob::Base
    include LockManager::Worker
    lock_with :nonblocking, key: "events:busy"

    def perform; end
  end

  class Rescheduling < ActiveJob::Base
    include LockManager::Worker
    lock_with :nonblocking, key: "events:busy", on_conflict: :reschedule

    def perform; end
  end
end

RSpec.describe "Events" do
  let(:locker) { new_locker }
  let(:events) { [] }
  let!(:subscriber) { LockManager.subscribe(/lock_manager/) { |event| events << event } }

  after { LockManager.unsubscribe(subscriber) }

  def named(name)
    events.select { |event| event.name == "#{name}.lock_manager" }.map(&:payload)
  end

  it "acquire and release of a nonblocking_lock: key, mode, fencing token, waited and held seconds" do
    result = locker.nonblocking_lock("e1", timeout: 5) { sleep 0.05 }

    expect(named(:acquire)).to match([hash_including(key: "e1", mode: :nonblocking, limit: 1, acquired: true,
                                                     contended: false, fencing_token: result.fencing_token,
                                                     waited: be_between(0, 0.05))])
    expect(named(:release)).to match([hash_including(key: "e1", released: true, lost: false,
                                                     held: be_between(0.05, 0.5))])
    expect(events.map(&:duration)).to all(be >= 0)
  end

  it "a refused nonblocking_lock is an acquire event that did not acquire, and no release" do
    elsewhere.try_lock("e2", timeout: 5)
    locker.nonblocking_lock("e2") { raise "not run" }

    refused = named(:acquire).select { |payload| payload[:mode] == :nonblocking }
    expect(refused).to eq([{ key: "e2", mode: :nonblocking, limit: 1, waited: refused.dig(0, :waited),
                             acquired: false, fencing_token: nil, contended: true }])
    expect(named(:release)).to eq([])
  end

  it "blocking_lock: the wait is measured; a wait that runs out is reported before LockNotAcquired" do
    held = elsewhere.try_lock("e3", timeout: 5)
    Thread.new { sleep 0.2; held.release } # rubocop:disable Style/Semicolon
    locker.blocking_lock("e3", timeout: 5) {}
    elsewhere.try_lock("e4", timeout: 5)
    expect { locker.blocking_lock("e4", timeout: 5, wait: 0.2) {} }.to raise_error(LockManager::LockNotAcquired)

    waited, refused = named(:acquire).select { |payload| payload[:mode] == :blocking }
    expect(waited).to include(key: "e3", acquired: true, waited: be_between(0.15, 1), contended: true)
    expect(refused).to include(key: "e4", acquired: false, contended: true, waited: be_between(0.2, 1))
  end

  it "a lock lost while its block ran: release says lost, and a lost event says why" do
    locker.nonblocking_lock("e5", timeout: 0.1) { sleep 0.25 }

    expect(named(:release)).to match([hash_including(key: "e5", released: false, lost: true)])
    expect(named(:lost)).to match([hash_including(key: "e5", held: be >= 0.25,
                                                  reason: /was lost while its block ran.*longer than its timeout/)])
  end

  it "renewals as they happen, and a loss the renewal finds while the block still runs, reported once" do
    during = nil
    result = locker.nonblocking_lock("r1", timeout: 0.3, renew: true) do
      sleep 0.8
      renewals = named(:renew).size
      redis.del("#{prefix}r1") # taken away: the next renewal finds it gone
      eventually(timeout: 1) { named(:lost).any? }
      during = [renewals, named(:lost)]
    end

    renewals, lost = during
    expect(renewals).to be >= 3 # every 0.1 s, reported while the block ran
    expect(named(:renew).first).to eq(key: "r1", ttl: 0.3, renewed: true)
    expect(lost).to match([hash_including(key: "r1", held: be_between(0.8, 2.5),
                                          reason: /"r1" was lost while held: a renewal found it expired/)])
    expect(result.lost?).to be(true)
    expect(named(:lost).size).to eq(1) # not again at the release
    expect(named(:release)).to match([hash_including(key: "r1", lost: true)])
  end

  it "try_lock, lock, refresh and release of a Lock" do
    lock = locker.try_lock("e6", timeout: 5)
    expect(lock.refresh(10)).to be(true)
    lock.release
    locker.lock("e7", timeout: 5).release

    expect(named(:acquire).map { |p| p.values_at(:key, :mode, :acquired) })
      .to eq([["e6", :try_lock, true], ["e7", :lock, true]])
    expect(named(:renew)).to eq([{ key: "e6", ttl: 10, renewed: true }])
    expect(named(:release).map { |p| p.values_at(:key, :released) }).to eq([["e6", true], ["e7", true]])
  end

  it "ActiveSupport::Notifications subscribers get the same events and payloads" do
    received = []
    as = ActiveSupport::Notifications.subscribe("acquire.lock_manager") { |*args| received << args.last }
    locker.nonblocking_lock("e8") {}
    ActiveSupport::Notifications.unsubscribe(as)

    expect(received).to eq(named(:acquire))
  end

  it "a subscriber that raises is logged, and the lock call goes on" do
    log = StringIO.new
    LockManager.configure { |c| c.logger = Logger.new(log) }
    failing = LockManager.subscribe("release.lock_manager") { raise "subscriber bug" }
    expect(locker.nonblocking_lock("e9") { :ran }.result).to eq(:ran)
    expect(locker.locked?("e9")).to be(false)
    expect(log.string).to include("a subscriber of release.lock_manager raised RuntimeError: subscriber bug")
  ensure
    LockManager.unsubscribe(failing)
    LockManager.configure { |c| c.logger = Logger.new($stderr, level: Logger::WARN) }
  end

  it "subscribe checks its arguments" do
    expect { LockManager.subscribe("acquire") {} }.to raise_error(ArgumentError, /unknown event "acquire"/)
    expect { LockManager.subscribe("acquire.lock_manager") }.to raise_error(ArgumentError, /block/)
  end

  it "with nobody listening no payload is built" do
    LockManager.unsubscribe(subscriber)
    expect(LockManager::Events.on?("acquire.lock_manager")).to be(false)
    expect(LockManager::Instrumentation.started).to be_nil
  end

  describe "conflict, for jobs" do
    before do
      configure_shared_locker!
      @logger = ActiveJob::Base.logger
      ActiveJob::Base.logger = Logger.new(nil)
    end

    after do
      ActiveJob::Base.logger = @logger
      LockManager.configure { |c| c.key_prefix = "lock:" }
    end

    it "a refused push names the job, its key, its strategy and the jid holding the lock" do
      EventJobs::Unique.queue_adapter = :test # this class's own: other specs run ActiveJob on Sidekiq
      first = EventJobs::Unique.perform_later(1)
      expect(EventJobs::Unique.perform_later(1)).to be(false)

      expect(named(:conflict)).to match([hash_including(class: "EventJobs::Unique", strategy: "until_executed",
                                                        holder: first.job_id, key: /\AEventJobs::Unique:\h{32}\z/)])
      expect(named(:conflict).first[:jid]).not_to eq(first.job_id)
    end

    it "a job skipped because its lock is held says so with its on_conflict" do
      EventJobs::Skipping.queue_adapter = :inline
      elsewhere_shared = LockManager::Locker.new(redis_url: redis_url, key_prefix: prefix)
      elsewhere_shared.try_lock("events:busy", timeout: 5)
      EventJobs::Skipping.perform_later

      expect(named(:conflict)).to match([hash_including(class: "EventJobs::Skipping", key: "events:busy",
                                                        strategy: "skip", reschedules: 0)])
    end

    it "a job rescheduled before says how many times, as its data carries it" do
      EventJobs::Rescheduling.queue_adapter = :test
      LockManager::Locker.new(redis_url: redis_url, key_prefix: prefix).try_lock("events:busy", timeout: 5)
      job = EventJobs::Rescheduling.new
      job.deserialize(job.serialize.merge("lock_manager_reschedules" => 2))
      job.perform_now

      expect(named(:conflict)).to match([hash_including(class: "EventJobs::Rescheduling", strategy: "reschedule",
                                                        reschedules: 2)])
      expect(EventJobs::Rescheduling.queue_adapter.enqueued_jobs.last).to include("lock_manager_reschedules" => 3)
    end
  end
end
