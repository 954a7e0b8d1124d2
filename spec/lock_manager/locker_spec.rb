# frozen_string_literal: true

require "spec_helper"

RSpec.describe LockManager::Locker do
  let(:locker) { new_locker }

  describe "#nonblocking_lock" do
    it "runs the block, returns its value in a Result and releases the lock" do
      result = locker.nonblocking_lock("job", timeout: 30) { :done }

      expect(result).to be_a(LockManager::Result)
      expect(result.run?).to be(true)
      expect(result.result).to eq(:done)
      expect(redis.exists?("#{prefix}job")).to be(false)
    end

    it "skips the block when the lock is held, and leaves the holder's lock alone" do
      inner = nil
      outer = locker.nonblocking_lock("job") do
        inner = elsewhere.nonblocking_lock("job") { raise "must not run" }
        expect(redis.exists?("#{prefix}job")).to be(true)
        :outer
      end

      expect(inner.run?).to be(false)
      expect(inner.result).to be_nil
      expect(outer.result).to eq(:outer)
    end

    it "stores a fresh token (who and when, and a random part) under key_prefix + key with the timeout as PX" do
      seen = []
      2.times do
        locker.nonblocking_lock("job", timeout: 7) do
          seen << [redis.get("#{prefix}job"), redis.pttl("#{prefix}job")]
        end
      end

      expect(seen.map(&:first)).to all(match(SpecHelpers::TOKEN))
      expect(seen.map(&:first).uniq.size).to eq(2)
      expect(seen.map(&:last)).to all(be_between(6_000, 7_000))
    end

    it "turns a fractional timeout into whole milliseconds" do
      pttl = locker.nonblocking_lock("job", timeout: 0.25) { redis.pttl("#{prefix}job") }.result
      expect(pttl).to be_between(1, 250)
    end

    it "uses lock: as the default prefix" do
      plain = LockManager::Locker.new(redis_url: redis_url)
      key = "#{prefix}default"
      held = plain.nonblocking_lock(key) { redis.exists?("lock:#{key}") }.result
      expect(held).to be(true)
    end

    it "lets an exception from the block propagate unchanged, after releasing the lock" do
      error = Class.new(StandardError)
      expect { locker.nonblocking_lock("job") { raise error, "boom" } }.to raise_error(error, "boom")
      expect(redis.exists?("#{prefix}job")).to be(false)
    end

    it "releases the lock when the block breaks, returns or throws out" do
      expect(catch(:out) { locker.nonblocking_lock("job") { throw :out, 1 } }).to eq(1)
      expect(locker.nonblocking_lock("job") { break 2 }).to eq(2)
      expect(redis.exists?("#{prefix}job")).to be(false)
    end

    it "never deletes another holder's lock when its own expired during the block" do
      other = new_locker
      other_lock = nil
      result = locker.nonblocking_lock("job", timeout: 0.2) do
        sleep 0.3
        other_lock = other.try_lock("job", timeout: 30)
        :slow
      end

      expect(result.result).to eq(:slow)
      expect(other_lock).not_to be_nil
      expect(redis.get("#{prefix}job")).to eq(other_lock.token)
      expect(other_lock.owned?).to be(true)
    end

    it "logs, rather than raises, when the lock could not be released after the block" do
      log = StringIO.new
      LockManager.configure { |c| c.logger = Logger.new(log) }
      result = locker.nonblocking_lock("job", timeout: 0.1) { sleep 0.2 }

      expect(result.run?).to be(true)
      expect(log.string).to include("job", "expired")
    end

    it "treats keys as bytes: binary, NUL and Symbol keys round-trip untouched" do
      binary = "\xFF\x00{*}\"'".b
      stored = locker.nonblocking_lock(binary) { held_keys(redis, "#{prefix}*").map(&:b) }.result
      expect(stored).to eq(["#{prefix}#{binary}".b])
      expect(locker.nonblocking_lock(:sym) { redis.exists?("#{prefix}sym") }.result).to be(true)
      utf8 = "clé-ü"
      expect(locker.nonblocking_lock(utf8) { redis.exists?("#{prefix}#{utf8}") }.result).to be(true)
    end

    # The hot path: with 8 threads, a Proc per call cost 2-4% of the lock cycles (see Result#yield_to).
    it "does not make its block a Proc" do
      locker.nonblocking_lock("k") {}
      GC.disable
      procs = ObjectSpace.each_object(Proc).count
      10.times { locker.nonblocking_lock("k") {} }
      # One per call before; fewer than that leaves room for a Proc another thread may make meanwhile.
      expect(ObjectSpace.each_object(Proc).count - procs).to be < 10
    ensure
      GC.enable
    end

    it "handles a 1 MB key" do
      key = "k" * 1_000_000
      expect(locker.nonblocking_lock(key) { redis.get("#{prefix}#{key}") }.result).to match(SpecHelpers::TOKEN)
      expect(locker.locked?(key)).to be(false)
    end
  end

  describe "#blocking_lock" do
    it "returns the block's value" do
      expect(locker.blocking_lock("job", timeout: 5) { 42 }).to eq(42)
      expect(redis.exists?("#{prefix}job")).to be(false)
    end

    it "waits for the holder, then runs" do
      holder = elsewhere.try_lock("job", timeout: 30)
      Thread.new { sleep(0.3) && holder.release }
      waited = elapsed { expect(locker.blocking_lock("job", timeout: 5) { :mine }).to eq(:mine) }
      expect(waited).to be_between(0.25, 3)
    end

    it "takes the lock soon after an expiry" do
      elsewhere.try_lock("job", timeout: 0.3)
      waited = elapsed { locker.blocking_lock("job", timeout: 5) { :ok } }
      expect(waited).to be_between(0.25, 3)
    end

    it "raises LockNotAcquired with the key and the seconds waited, never sleeping past the deadline" do
      elsewhere.try_lock("job", timeout: 30)
      error, took = timed_error(LockManager::LockNotAcquired) do
        locker.blocking_lock("job", timeout: 0.5) { raise "must not run" }
      end

      expect(error.key).to eq("job")
      expect(error.waited).to be_between(0.5, 0.75)
      expect(error.message).to include('"job"', "0.5")
      expect(took).to be < 0.9
      expect(error).to be_a(LockManager::Error)
    end

    it "runs blocks one after another across threads, never overlapping" do
      events = Queue.new
      threads = Array.new(3) do |i|
        Thread.new do
          locker.blocking_lock("job", timeout: 10) do
            events << [:start, i]
            sleep 0.1
            events << [:finish, i]
          end
        end
      end
      threads.each(&:join)
      log = Array.new(events.size) { events.pop }

      expect(log.map(&:first)).to eq(%i[start finish] * 3)
      expect(log.each_slice(2).map { |(s, f)| s.last == f.last }).to all(be(true))
    end

    it "honours retry_interval as the cap of its backoff" do
      slow = new_locker(retry_interval: 0.5)
      holder = elsewhere.try_lock("job", timeout: 30)
      Thread.new { sleep(0.2) && holder.release }
      # With a 0.5 s cap the first pauses are still a few ms: the release is seen quickly.
      expect(elapsed { slow.blocking_lock("job", timeout: 5) {} }).to be < 1.0
    end
  end

  describe "limit: N holders per key" do
    it "admits up to `limit` blocks at once and skips the next" do
      inside = Queue.new
      release = Queue.new
      holders = Array.new(3) do
        Thread.new { locker.nonblocking_lock("pool", limit: 3) { (inside << 1) && release.pop } }
      end
      3.times { inside.pop }

      fourth = locker.nonblocking_lock("pool", limit: 3) { :never }
      3.times { release << true }
      results = holders.map(&:value)

      expect(fourth.run?).to be(false)
      expect(results.map(&:run?)).to all(be(true))
      expect(redis.exists?("#{prefix}pool")).to be(false)
    end

    it "never lets more than `limit` blocking callers in at once" do
      inside = 0
      most_inside = 0
      guard = Mutex.new
      Array.new(6) do
        Thread.new do
          3.times do
            locker.blocking_lock("pool", limit: 2, timeout: 10) do
              guard.synchronize { most_inside = [most_inside, inside += 1].max }
              sleep 0.02
              guard.synchronize { inside -= 1 }
            end
          end
        end
      end.each(&:join)

      expect(most_inside).to eq(2)
    end

    it "frees the slot of a holder that expired, without touching the others" do
      short = locker.nonblocking_lock("pool", limit: 2, timeout: 0.1) do
        locker.nonblocking_lock("pool", limit: 2, timeout: 30) do
          sleep 0.2
          locker.nonblocking_lock("pool", limit: 2) { :took_the_expired_slot }.result
        end.result
      end
      expect(short.result).to eq(:took_the_expired_slot)
    end

    it "rejects a limit that is not a positive Integer, before reaching Redis" do
      unreachable = LockManager::Locker.new(redis_url: closed_url)
      [0, -1, 1.5, "2", nil].each do |limit|
        expect { unreachable.nonblocking_lock("k", limit: limit) {} }.to raise_error(ArgumentError, /limit/)
        expect { unreachable.blocking_lock("k", limit: limit) {} }.to raise_error(ArgumentError, /limit/)
      end
    end
  end

  describe "lock handles" do
    it "try_lock returns a Lock whose token holds the key, or nil when held" do
      lock = locker.try_lock("job", timeout: 30)

      expect(lock).to be_a(LockManager::Lock)
      expect(lock.key).to eq("job")
      expect(lock.token).to match(SpecHelpers::TOKEN)
      expect(redis.get("#{prefix}job")).to eq(lock.token)
      expect(elsewhere.try_lock("job")).to be_nil
    end

    it "lock waits, then returns a Lock, or raises LockNotAcquired" do
      first = locker.lock("job", timeout: 30)
      expect { elsewhere.lock("job", timeout: 0.2) }.to raise_error(LockManager::LockNotAcquired)
      first.release
      expect(locker.lock("job", timeout: 1).owned?).to be(true)
    end

    it "owned? asks Redis, and turns false after expiry" do
      lock = locker.try_lock("job", timeout: 0.2)
      expect(lock.owned?).to be(true)
      sleep 0.3
      expect(lock.owned?).to be(false)
    end

    it "refresh resets the TTL only while the token holds the key" do
      lock = locker.try_lock("job", timeout: 1)
      expect(lock.refresh(10)).to be(true)
      expect(redis.pttl("#{prefix}job")).to be_between(9_000, 10_000)

      redis.set("#{prefix}job", "someone-else", px: 5_000)
      expect(lock.refresh(60)).to be(false)
      expect(redis.pttl("#{prefix}job")).to be <= 5_000
    end

    it "release deletes only its own lock and reports whether it did" do
      lock = locker.try_lock("job", timeout: 30)
      expect(lock.release).to be(true)
      expect(lock.release).to be(false)

      again = locker.try_lock("job", timeout: 30)
      expect(lock.release).to be(false)
      expect(again.owned?).to be(true)
    end

    it "locked? tells whether anyone holds the key" do
      expect(locker.locked?("job")).to be(false)
      lock = locker.try_lock("job")
      expect(new_locker.locked?("job")).to be(true)
      lock.release
      expect(locker.locked?("job")).to be(false)
    end
  end

  describe "class-level API" do
    before { configure_shared_locker! }

    it "uses one shared Locker built from LockManager.config" do
      expect(described_class.instance).to equal(LockManager.locker)
      result = described_class.nonblocking_lock("MyWorker", timeout: 30) { redis.exists?("#{prefix}MyWorker") }
      expect(result.result).to be(true)
      expect(described_class.blocking_lock("MyWorker", timeout: 30) { :value }).to eq(:value)
    end

    it "rebuilds the shared Locker after configure" do
      before = described_class.instance
      LockManager.configure { |c| c.pool_size = 2 }
      expect(described_class.instance).not_to equal(before)
      expect(described_class.instance.settings[:pool_size]).to eq(2)
    end

    it "exposes Result as LockManager::Locker::Result too" do
      expect(LockManager::Locker::Result).to equal(LockManager::Result)
    end
  end
end
