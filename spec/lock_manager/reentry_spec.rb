# frozen_string_literal: true

require "spec_helper"

# A thread that asks again for a plain lock it holds would wait for itself: it is told at once.
RSpec.describe "Asking again for a lock this thread holds" do
  let(:locker) { new_locker }

  it "is the Ruby Thread that holds it, not the native thread under it, which Ruby gives the next Thread" do
    holding = Thread.new { locker.try_lock("handed", timeout: 30) }.value # the handle outlives its thread
    # Ruby 3.1 runs the next Thread on the finished one's native thread (3.3.8 starts a new one).
    asking = Thread.new do
      locker.try_lock("handed", timeout: 30)
    rescue LockManager::AlreadyHeld => e
      e
    end.value

    expect(holding).to be_a(LockManager::Lock)
    expect(asking).to be_nil # held by another: not this thread's own lock
    holding.release
  end

  it "raises AlreadyHeld at once, naming the key, from every call" do
    locker.nonblocking_lock("job") do
      calls = [
        -> { locker.blocking_lock("job", timeout: 30) {} },
        -> { locker.blocking_lock("job", timeout: 30, fair: true) {} },
        -> { locker.nonblocking_lock("job") {} },
        -> { locker.try_lock("job") },
        -> { locker.lock("job", timeout: 30) }
      ]
      calls.each do |call|
        error, took = (begin
          [nil, elapsed(&call)]
        rescue LockManager::AlreadyHeld => e
          [e, 0]
        end)
        expect(error).to be_a(LockManager::AlreadyHeld)
        expect(error).to be_a(LockManager::Error)
        expect(error.message).to include('"job"', "already held")
        expect(took).to be < 0.1
      end
    end
    expect(locker.nonblocking_lock("job") { :free_again }.result).to eq(:free_again)
  end

  it "is about this thread and this Locker only: other threads and other Lockers wait as usual" do
    other_locker = new_locker
    locker.nonblocking_lock("job", timeout: 30) do
      from_thread = Thread.new { locker.nonblocking_lock("job") { :ran }.run? }.value
      from_other = other_locker.nonblocking_lock("job") { :ran }.run?
      expect([from_thread, from_other]).to eq([false, false])
    end
  end

  it "holds while a handle is held, until it is released (from any thread)" do
    handle = locker.try_lock("h", timeout: 30)
    expect { locker.try_lock("h") }.to raise_error(LockManager::AlreadyHeld)
    Thread.new { handle.release }.join
    expect(locker.try_lock("h").release).to be(true)
  end

  it "lets one thread take several permits of a semaphore (limit: N)" do
    taken = locker.nonblocking_lock("sem", limit: 2) { locker.nonblocking_lock("sem", limit: 2) { :both }.result }
    expect(taken.result).to eq(:both)
  end

  it "forgets the lock once the block ends, whatever way it ends" do
    expect { locker.nonblocking_lock("x") { raise "boom" } }.to raise_error("boom")
    expect { locker.blocking_lock("x", timeout: 5) { throw :out } }.to throw_symbol(:out)
    expect(locker.blocking_lock("x", timeout: 5) { :again }).to eq(:again)
  end

  it "forgets the lock it released, not an expired handle of the same key kept beside it" do
    stale = locker.try_lock("k", timeout: 0.05)
    sleep 0.1
    expect(locker.nonblocking_lock("k") { :first }.result).to eq(:first)
    expect(locker.locked?("k")).to be(false)
    expect(locker.nonblocking_lock("k") { :second }.result).to eq(:second)
    expect(stale.release).to be(false)
  end
end
