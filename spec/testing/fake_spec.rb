# frozen_string_literal: true

require "spec_helper"
require "logger"
require "stringio"
require "lock_manager/testing/rspec"
require_relative "../support/lock_backend_examples"

# LockManager::Testing.fake!: in-process locks with the semantics of the Redis ones, through the
# same Locker API (the Lockers here are built before the mode is switched on, by `lock_manager:`).
RSpec.describe "LockManager::Testing.fake!", lock_manager: :fake do
  let(:log) { StringIO.new }
  let(:locker) { LockManager::Locker.new }
  # Another Locker: a holder elsewhere.
  let(:elsewhere) { LockManager::Locker.new }

  before { LockManager.configure { |c| c.logger = Logger.new(log) } }

  include FakeQueuedWaiters

  include_examples "a lock backend"

  it "issues fencing tokens that only grow across keys too (one counter for the whole fake)" do
    tokens = Array.new(3) { |n| locker.nonblocking_lock("invoice:#{n}", &:fencing_token).fencing_token }

    expect(tokens.each_cons(2).all? { |a, b| b > a }).to be(true)
  end

  it "turns lost? true while the block runs once a renewed lock is taken away (reset!)" do
    result = locker.nonblocking_lock("renewed", renew: true) do |running|
      before = running.lost?
      LockManager::Testing.reset!
      [before, running.lost?]
    end

    expect(result.result).to eq([false, true])
    expect(result.lost?).to be(true)
  end

  it "issues fencing tokens that only grow, per key and across keys, claims included" do
    tokens = Array.new(5) { locker.nonblocking_lock("invoice:42", &:fencing_token).fencing_token }
    tokens << locker.nonblocking_lock("invoice:43", &:fencing_token).fencing_token
    tokens << locker.claim(["invoice:42"], ["jid-1"], [60]).first
    lock = Thread.new { locker.try_lock("invoice:44") }.value
    tokens << lock.fencing_token

    expect(tokens).to all(be_a(Integer))
    expect(tokens.each_cons(2).all? { |a, b| b > a }).to be(true)
    expect(tokens.first).to be > 1_600_000_000_000_000 # seeded from the clock in microseconds, as the real counter
  end

  describe "lock handles" do
    it "lock waits for a release, and a renewed handle's lost? turns true when it is taken away" do
      thread, release = hold_in_thread("handle", timeout: 30)
      Thread.new do
        sleep 0.1
        release << true
      end
      lock = locker.lock("handle", timeout: 0.1, wait: 5, renew: true)
      sleep 0.2
      kept = lock.owned?
      LockManager::Testing.reset!
      thread.join

      expect([kept, lock.lost?, lock.owned?]).to eq([true, true, false])
    end
  end

  it "reset! forgets every lock" do
    lock = locker.try_lock("forgotten", timeout: 30)
    locker.claim(["claimed"], ["jid-1"], [60])

    LockManager::Testing.reset!

    expect([locker.locked?("forgotten"), locker.locked?("claimed"), lock.owned?]).to eq([false, false, false])
    expect(locker.nonblocking_lock("forgotten") { :again }.result).to eq(:again) # no AlreadyHeld left behind
  end

  it "never opens a connection: the pool stays empty and no eviction policy is asked" do
    locker.nonblocking_lock("report") {}
    locker.blocking_lock("report") {}

    expect(locker.pool_state).to eq([0, 0])
    expect(log.string).to be_empty
  end
end
