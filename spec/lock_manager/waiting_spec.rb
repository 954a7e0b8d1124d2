# frozen_string_literal: true

require "spec_helper"

# Waiting is event-driven: a release is published, one subscriber connection per Locker wakes
# the waiting threads; the holder's TTL wakes them when nobody releases. A retry_interval of
# several seconds below proves that nothing here is polling.
RSpec.describe "Waiting for a lock" do
  let(:server) { RedisServer.new.start }
  let(:admin) { server.client }
  let(:slow_poll) { 5 } # seconds: a polling waiter would take this long to notice

  after do
    admin.close
    server.shutdown
  end

  def locker(**options)
    LockManager::Locker.new(redis_url: server.url, key_prefix: prefix, retry_interval: slow_poll, **options)
  end

  def subscriber_connections
    admin.client(:list).count { |c| c["psub"].to_i.positive? }
  end

  # Starts a thread that waits in blocking_lock and records when it got in.
  def waiter(lock_manager, key, log = Queue.new, label = nil, **options)
    Thread.new do
      lock_manager.blocking_lock(key, timeout: 20, **options) { log << [label, monotonic] }
    end
  end

  it "wakes a waiting thread as soon as the lock is released" do
    l = locker
    holder = l.try_lock("k")
    log = Queue.new
    thread = waiter(l, "k", log)
    sleep 0.3 # well into its wait
    released_at = monotonic
    holder.release
    thread.join

    expect(log.pop.last - released_at).to be < 0.2
  end

  it "wakes waiters in another process the same way" do
    l = locker
    holder = l.try_lock("k")
    url = server.url
    key_prefix = prefix
    reader, writer = IO.pipe
    pid = fork do
      child = LockManager::Locker.new(redis_url: url, key_prefix: key_prefix, retry_interval: 5)
      writer.puts "waiting"
      child.blocking_lock("k", timeout: 20) { writer.puts Process.clock_gettime(Process::CLOCK_MONOTONIC) }
      exit!(0)
    end
    expect(reader.gets).to eq("waiting\n")
    sleep 0.3
    released_at = monotonic
    holder.release
    entered_at = Float(reader.gets)
    Process.wait(pid)

    expect(entered_at - released_at).to be < 0.2
  end

  it "takes an expired lock when its TTL runs out, without polling" do
    l = locker
    locker.try_lock("k", timeout: 0.4) # never released (another Locker: another holder)
    took = elapsed { l.blocking_lock("k", timeout: 20) { :mine } }

    expect(took).to be_between(0.35, 0.8)
  end

  it "keeps a lock handed over by a release (taken on the release's message alone, for 2 s) for the waiter's " \
     "whole timeout, in a block and as a handle" do
    l = locker(pool_size: 4)
    other = locker
    holders = %w[block handle].map { |key| l.try_lock(key, timeout: 30) }
    in_block = Queue.new
    block_waiter = Thread.new do
      l.blocking_lock("block", timeout: 30) do |result|
        sleep 2.5 # past the hand-off's 2 s
        in_block << [admin.pttl("#{prefix}block"), other.try_lock("block"), result.lost?, result.fencing_token]
        :ran
      end
    end
    handle_waiter = Thread.new { l.lock("handle", timeout: 30) }
    eventually { %w[block handle].all? { |key| admin.zcard(queue_key("#{prefix}#{key}")) == 1 } }
    holders.each(&:release)
    handle = handle_waiter.value
    sleep 2.5

    expect([admin.pttl("#{prefix}handle"), other.try_lock("handle"), handle.owned?, handle.lost?])
      .to match([be > 25_000, nil, true, false])
    expect(handle.fencing_token).to be > holders.last.fencing_token
    expect(handle.release).to be(true)
    expect(block_waiter.value).to eq(:ran)
    *seen, fencing_token = in_block.pop
    expect(seen).to match([be > 25_000, nil, false])
    expect(fencing_token).to be > holders.first.fencing_token
    expect(held_keys(admin, "#{prefix}*")).to eq([])
  end

  it "lets Lock#refresh on a lock handed over have the last word over its pending extension" do
    l = locker(pool_size: 2)
    holder = l.try_lock("k", timeout: 30)
    waiter = Thread.new { l.lock("k", timeout: 30) }
    eventually { admin.zcard(queue_key("#{prefix}k")) == 1 }
    holder.release
    handle = waiter.value
    expect(handle.refresh(60)).to be(true)
    sleep 1.5 # past the extension's time (halfway to the hand-off's 2 s)

    expect(admin.pttl("#{prefix}k")).to be > 55_000
    expect(handle.release).to be(true)
  end

  it "shares one subscriber connection between all waiting threads of a Locker" do
    l = locker(pool_size: 8)
    holders = Array.new(8) { |i| l.try_lock("k#{i}") }
    log = Queue.new
    threads = Array.new(8) { |i| waiter(l, "k#{i}", log, i) }
    sleep 0.3

    expect(subscriber_connections).to eq(1)
    holders.each(&:release)
    threads.each(&:join)
    expect(log.size).to eq(8)
  end

  it "falls back to polling when its subscriber connection dies, and subscribes again" do
    l = locker(retry_interval: 0.05)
    holder = l.try_lock("k")
    log = Queue.new
    thread = waiter(l, "k", log)
    eventually { subscriber_connections == 1 }
    admin.client(:kill, "type", "pubsub")
    holder.release
    thread.join(5)

    expect(log.size).to eq(1)
    eventually { subscriber_connections == 1 }
  end

  describe "fair: true" do
    it "gives the lock to waiting threads in arrival order" do
      l = locker(pool_size: 6)
      holder = l.try_lock("k")
      log = Queue.new
      threads = Array.new(5) do |i|
        waiter(l, "k", log, i, fair: true).tap { eventually { admin.zcard(queue_key("#{prefix}k")) == i + 1 } }
      end
      holder.release
      threads.each(&:join)

      expect(Array.new(5) { log.pop.first }).to eq([0, 1, 2, 3, 4])
    end

    it "serves waiters of several processes in arrival order" do
      l = locker
      holder = l.try_lock("k")
      url = server.url
      key_prefix = prefix
      pids = Array.new(3) do |i|
        pid = fork do
          child = LockManager::Locker.new(redis_url: url, key_prefix: key_prefix, retry_interval: 5)
          child.blocking_lock("k", timeout: 20, fair: true) { Redis.new(url: url).rpush("#{key_prefix}order", i) }
          exit!(0)
        end
        eventually(timeout: 10) { admin.zcard(queue_key("#{prefix}k")) == i + 1 } # queued before the next forks
        pid
      end
      holder.release
      pids.each { |pid| Process.wait(pid) }

      expect(admin.lrange("#{prefix}order", 0, -1)).to eq(%w[0 1 2])
    end

    it "is the default when configured" do
      expect(locker(fair: true).fair?).to be(true)
      expect(locker.fair?).to be(false)
      expect { locker(fair: "yes") }.to raise_error(ArgumentError, /fair/)
      expect { locker.blocking_lock("k", fair: nil) {} }.to raise_error(ArgumentError, /fair/)
    end

    it "frees the line when a queued waiter dies (after its heartbeat, not the lock's TTL)" do
      l = locker
      holder = l.try_lock("k", timeout: 30)
      url = server.url
      key_prefix = prefix
      doomed = fork do
        LockManager::Locker.new(redis_url: url, key_prefix: key_prefix).blocking_lock("k", timeout: 60, fair: true) {}
        exit!(0)
      end
      eventually { admin.zcard(queue_key("#{prefix}k")) == 1 }
      Process.kill(:KILL, doomed)
      Process.wait(doomed)
      log = Queue.new
      thread = waiter(l, "k", log, :next, fair: true)
      sleep 0.1
      holder.release # handed to the dead waiter, or skipped if its heartbeat already ran out
      thread.join(10)

      expect(log.size).to eq(1)
    end
  end

  it "does not let a thread that releases and re-acquires in a loop starve a waiter" do
    l = locker(retry_interval: 0.1)
    hogging = true
    hog = Thread.new do
      l.blocking_lock("k", timeout: 20) { sleep 0.005 } while hogging
    end
    sleep 0.05
    waited = elapsed { l.blocking_lock("k", timeout: 20) { hogging = false } }
    hog.join

    # A few of the hog's 5 ms rounds at most: the release hands the lock to the queued waiter.
    expect(waited).to be < 0.3
  end

  it "leaves the queue when it gives up, and leaves nothing behind" do
    l = locker
    holder = locker.try_lock("k") # another Locker: another holder
    expect { l.blocking_lock("k", timeout: 0.3, fair: true) {} }.to raise_error(LockManager::LockNotAcquired)
    expect(held_keys(admin, "#{prefix}*").sort).to eq(["#{prefix}k"])
    holder.release
    expect(held_keys(admin, "#{prefix}*")).to eq([])
  end
end
