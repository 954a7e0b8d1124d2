# frozen_string_literal: true

require "spec_helper"
require_relative "../support/process_helpers"

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

  describe "a lock handed over by a release" do
    include ProcessHelpers

    after { stop_all }

    # A process of its own that waits in blocking_lock("k", timeout: 30). It says "waiting", then
    # "in" as its block starts; the block ends when told "go"; then it says whether the lock was
    # lost.
    def waiting_process(fair:)
      url = server.url
      key_prefix = prefix
      fork_child do |parent|
        child = LockManager::Locker.new(redis_url: url, key_prefix: key_prefix, retry_interval: 5)
        parent.puts "waiting"
        seen = nil
        child.blocking_lock("k", timeout: 30, fair: fair) do |result|
          seen = result
          parent.puts "in"
          parent.gets(timeout: 20)
        end
        parent.puts "lost=#{seen.lost?}"
      end
    end

    def queued(key)
      admin.zcard(queue_key("#{prefix}#{key}"))
    end

    [false, true].each do |fair|
      it "starts the block (fair: #{fair}) with the lock living the waiter's whole timeout, not the hand-off's " \
         "2 s; a handle too" do
        l = locker(pool_size: 4)
        # Told by the release's reply (same Locker), and by the subscriber (another one).
        holders = [l.try_lock("block", timeout: 30), locker.try_lock("handle", timeout: 30)]
        block_waiter = Thread.new do
          l.blocking_lock("block", timeout: 30, fair: fair) do |result|
            [admin.pttl("#{prefix}block"), result.fencing_token]
          end
        end
        handle_waiter = Thread.new { l.lock("handle", timeout: 30, fair: fair) }
        eventually { %w[block handle].all? { |key| queued(key) == 1 } }
        holders.each { |holder| expect(holder.release).to be(true) }
        handle = handle_waiter.value
        handle_pttl = admin.pttl("#{prefix}handle")
        block_pttl, fencing_token = block_waiter.value

        expect([block_pttl, handle_pttl]).to all(be_within(1_000).of(30_000))
        expect([fencing_token, handle.fencing_token]).to match([be > holders.first.fencing_token,
                                                                be > holders.last.fencing_token])
        expect([handle.owned?, handle.lost?, handle.release]).to eq([true, false, true])
        expect(held_keys(admin, "#{prefix}*")).to eq([])
      end

      it "keeps a lock handed to a process (fair: #{fair}) that stops for 2.5 s as its block starts, past the " \
         "hand-off's 2 s: nobody else takes it meanwhile" do
        holder = locker.try_lock("k", timeout: 30)
        waiting = waiting_process(fair: fair)
        expect(waiting.gets).to eq("waiting")
        eventually { queued("k") == 1 }
        expect(holder.release).to be(true) # handed to the waiting process
        expect(waiting.gets).to eq("in")
        waiting.kill(:STOP) # its renewal thread too, as on a machine too loaded to run it
        sleep 2.5
        stalled = [admin.pttl("#{prefix}k"), locker.try_lock("k")]
        waiting.kill(:CONT)
        waiting.puts "go"

        expect(stalled).to match([be > 25_000, nil])
        expect(waiting.gets).to eq("lost=false")
        expect(waiting.wait&.exitstatus).to eq(0)
        expect(held_keys(admin, "#{prefix}*")).to eq([])
      end

      it "lets a lock handed to a waiting process (fair: #{fair}) that stopped before it could take it lapse " \
         "after the hand-off's 2 s, not its timeout; the process takes the lock later, once it runs again" do
        l = locker
        holder = locker.try_lock("k", timeout: 30)
        stopped = waiting_process(fair: fair)
        expect(stopped.gets).to eq("waiting")
        eventually { queued("k") == 1 }
        stopped.kill(:STOP) # as if it had died: its place in the queue lives on for up to 2 s
        next_waiter = Thread.new do
          l.blocking_lock("k", timeout: 30, fair: fair) { [monotonic, admin.pttl("#{prefix}k")] }
        end
        eventually { queued("k") == 2 }
        released_at = monotonic
        expect(holder.release).to be(true) # handed to the stopped process, first in the queue
        handed = [admin.get("#{prefix}k"), admin.pttl("#{prefix}k")]
        entered_at, next_pttl = next_waiter.value
        stopped.kill(:CONT)
        expect(stopped.gets).to eq("in") # it finds the hand-off lapsed, and queues again
        stopped.puts "go"

        expect(handed).to match([satisfy { |token| token && token != holder.token }, be_between(1, 2_000)])
        expect(entered_at - released_at).to be_between(1.5, 3.5)
        expect(next_pttl).to be_within(1_000).of(30_000)
        expect(stopped.gets).to eq("lost=false")
        expect(held_keys(admin, "#{prefix}*")).to eq([])
      end
    end

    it "lets Lock#refresh on a lock handed over have the last word: nothing sets its TTL behind the caller's back" do
      l = locker(pool_size: 2)
      holder = l.try_lock("k", timeout: 30)
      waiter = Thread.new { l.lock("k", timeout: 30) }
      eventually { queued("k") == 1 }
      holder.release
      handle = waiter.value
      expect(handle.refresh(60)).to be(true)
      sleep 1.5 # past half the hand-off's 2 s

      expect(admin.pttl("#{prefix}k")).to be > 55_000
      expect(handle.release).to be(true)
    end
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
