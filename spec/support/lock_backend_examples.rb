# frozen_string_literal: true

require "logger"
require "stringio"

# What a lock does, whichever backend serves it: Redis (spec/lock_manager/backends_spec.rb) or the testing
# mode's in-process fake (spec/testing/fake_spec.rb). The including group gives `locker` and `elsewhere`
# (two Lockers on the same keys), `log` (what LockManager's logger wrote) and `await_queued(thread, key,
# count)`, which returns once `count` waiters are queued for `key`, the last of them `thread`.
RSpec.shared_examples "a lock backend" do
  # Runs the block in a thread that holds `key` until `release` is pushed to the returned queue.
  # (Played from another thread: in the fake every Locker shares one keyspace, and a thread asking
  # again for a plain lock it holds gets AlreadyHeld.)
  def hold_in_thread(key, **options)
    release = Queue.new
    taken = Queue.new
    thread = Thread.new do
      elsewhere.nonblocking_lock(key, **options) do
        taken << true
        release.pop
      end
    end
    taken.pop
    [thread, release]
  end

  it "lets one of 8 threads at a time into the block, with no lost updates" do
    inside = 0
    most_inside = 0
    count = 0
    guard = Mutex.new
    threads = Array.new(8) do
      Thread.new do
        25.times do
          locker.blocking_lock("counter", timeout: 10) do
            guard.synchronize { most_inside = [most_inside, inside += 1].max }
            value = count # a read-modify-write that loses updates when unlocked
            sleep 0.0005
            count = value + 1
            guard.synchronize { inside -= 1 }
          end
        end
      end
    end
    threads.each(&:join)

    expect(most_inside).to eq(1)
    expect(count).to eq(200)
    expect(locker.locked?("counter")).to be(false)
  end

  it "skips the block while another holds the key, and runs it once the key is free" do
    thread, release = hold_in_thread("report")

    skipped = locker.nonblocking_lock("report") { :ran }
    release << true
    thread.join
    ran = locker.nonblocking_lock("report") { :ran }

    expect([skipped.run?, skipped.result, skipped.fencing_token]).to eq([false, nil, nil])
    expect([ran.run?, ran.result, ran.lost?]).to eq([true, :ran, false])
  end

  it "frees a lock whose timeout passed: another takes it, and the first holder's Result is lost?" do
    taken = Queue.new
    first = Thread.new do
      locker.nonblocking_lock("ttl", timeout: 0.2) do
        taken << true
        sleep 0.5
      end
    end
    taken.pop
    held_at_first = elsewhere.nonblocking_lock("ttl") { :second }.run?
    sleep 0.3
    second = elsewhere.nonblocking_lock("ttl") { :second }

    expect(held_at_first).to be(false)
    expect([second.run?, second.result]).to eq([true, :second])
    expect(first.value.lost?).to be(true)
    expect(log.string).to include('lock "ttl" was lost while its block ran', "longer than its timeout of 0.2s")
  end

  it "raises LockLost after the block with on_lost: :raise" do
    LockManager.configure { |c| c.on_lost = :raise }
    shared = LockManager::Locker.instance

    expect { shared.nonblocking_lock("ttl", timeout: 0.05) { sleep 0.1 } }
      .to raise_error(LockManager::LockLost, /lock "ttl" was lost while its block ran/)
  end

  it "keeps a renewed lock past its timeout, and stops at max_hold" do
    renewed = locker.nonblocking_lock("renewed", timeout: 0.1, renew: true) do |result|
      sleep 0.3
      [result.lost?, Thread.new { elsewhere.locked?("renewed") }.value]
    end
    capped = locker.nonblocking_lock("capped", timeout: 0.1, renew: true, max_hold: 0.5) do |result|
      sleep 0.2
      lost_before = result.lost?
      sleep 0.4
      [lost_before, result.lost?]
    end

    expect([renewed.result, renewed.lost?]).to eq([[false, true], false])
    expect([capped.result, capped.lost?]).to eq([[false, true], true])
  end

  it "admits `limit` holders at once, each with its own fencing token" do
    ready = Queue.new
    release = Queue.new
    holders = Array.new(3) do
      Thread.new do
        locker.nonblocking_lock("partner-api", limit: 3) do |lock|
          ready << lock.fencing_token
          release.pop
        end
      end
    end
    tokens = Array.new(3) { ready.pop }
    fourth = elsewhere.nonblocking_lock("partner-api", limit: 3) { :ran }
    3.times { release << true }
    holders.each(&:join)
    after = elsewhere.nonblocking_lock("partner-api", limit: 3) { :ran }

    expect(tokens.uniq.size).to eq(3)
    expect(fourth.run?).to be(false)
    expect(after.run?).to be(true)
  end

  it "lets one thread take a limit: N key twice (each acquisition is a permit)" do
    inner = locker.nonblocking_lock("pool", limit: 2) { locker.nonblocking_lock("pool", limit: 2) { :inner } }

    expect(inner.result.result).to eq(:inner)
  end

  it "wakes a blocking wait when the holder releases, long before the holder's timeout" do
    thread, release = hold_in_thread("report", timeout: 30)
    Thread.new do
      sleep 0.2
      release << true
    end

    started = monotonic
    value = locker.blocking_lock("report", timeout: 5) { :mine }
    waited = monotonic - started
    thread.join

    expect(value).to eq(:mine)
    expect(waited).to be_between(0.15, 1.0)
  end

  it "wakes a blocking wait when the holder's timeout passes" do
    thread, release = hold_in_thread("report", timeout: 0.3)

    waited = elapsed { locker.blocking_lock("report", timeout: 5) { :mine } }
    release << true

    expect(waited).to be_between(0.15, 1.0)
    expect(thread.value.lost?).to be(true)
  end

  it "gives up a blocking wait after its timeout with LockNotAcquired naming the key and the time waited" do
    thread, release = hold_in_thread("report", timeout: 30)

    error, took = timed_error(LockManager::LockNotAcquired) { locker.blocking_lock("report", timeout: 0.3) { :never } }
    handle_error, = timed_error(LockManager::LockNotAcquired) { locker.lock("report", timeout: 10, wait: 0.1) }
    release << true
    thread.join

    expect(took).to be_between(0.29, 1.0)
    expect(error.key).to eq("report")
    expect(error.waited).to be_between(0.29, 1.0)
    expect(error.message).to match(/\Alock "report" is held by another owner; gave up after \d\.\d{3}s\z/)
    expect(handle_error.key).to eq("report")
    expect(locker.locked?("report")).to be(false)
  end

  it "hands a released lock to the waiter queued for it: its releaser cannot take it straight back" do
    taken = Queue.new
    release = Queue.new
    again = Thread.new do
      elsewhere.nonblocking_lock("report") do
        taken << true
        release.pop
      end
      elsewhere.nonblocking_lock("report") { :barged }.run?
    end
    taken.pop
    done = Queue.new # the waiter holds the lock until the releaser has tried again
    waiter = Thread.new { locker.blocking_lock("report", timeout: 5) { done.pop && :waited } }
    await_queued(waiter, "report", 1)
    release << true
    barged = again.value
    done << true

    expect(barged).to be(false)
    expect(waiter.value).to eq(:waited)
  end

  it "serves fair waiters in the order they arrived" do
    thread, release = hold_in_thread("queue", timeout: 30)
    order = Queue.new
    waiters = Array.new(4) do |n|
      waiter = Thread.new { locker.blocking_lock("queue", timeout: 10, fair: true) { order << n } }
      waiter.tap { await_queued(waiter, "queue", n + 1) } # queued before the next arrives
    end
    release << true
    [thread, *waiters].each(&:join)

    expect(Array.new(4) { order.pop }).to eq([0, 1, 2, 3])
  end

  it "takes a waiter interrupted by Timeout out of the queue: the lock it was owed goes on" do
    thread, release = hold_in_thread("report", timeout: 30)
    interrupted = Thread.new do
      Timeout.timeout(0.1) { locker.blocking_lock("report", timeout: 10) { :never } }
    rescue Timeout::Error
      :interrupted
    end
    patient = Thread.new do
      sleep 0.05
      locker.blocking_lock("report", timeout: 10) { :patient }
    end
    sleep 0.3
    release << true
    thread.join

    expect(interrupted.value).to eq(:interrupted)
    expect(patient.value).to eq(:patient)
    expect(locker.locked?("report")).to be(false)
  end

  it "raises AlreadyHeld for a thread asking again for a plain lock it holds" do
    expect { locker.nonblocking_lock("report") { locker.blocking_lock("report") { :inner } } }
      .to raise_error(LockManager::AlreadyHeld, /\Alock "report": already held by this thread/)
    expect(locker.locked?("report")).to be(false)
  end

  it "releases the lock when the block raises, and passes the error on" do
    expect { locker.nonblocking_lock("report") { raise ArgumentError, "boom" } }.to raise_error(ArgumentError, "boom")
    expect(locker.locked?("report")).to be(false)
  end

  it "yields the Result to a block that takes it: its fencing token, and lost? false" do
    seen = nil
    result = locker.nonblocking_lock("report") do |running|
      seen = [running.run?, running.fencing_token, running.lost?]
      :value
    end

    expect(seen).to eq([true, result.fencing_token, false])
    expect([result.run?, result.result, result.lost?]).to eq([true, :value, false])
  end

  it "issues fencing tokens that only grow for a key, claims included, seeded from the clock" do
    tokens = Array.new(5) { locker.nonblocking_lock("invoice:42", &:fencing_token).fencing_token }
    tokens << locker.claim(["invoice:42"], ["jid-1"], [60]).first
    locker.release_claim("invoice:42", "jid-1")
    tokens << Thread.new { locker.try_lock("invoice:42") }.value.fencing_token

    expect(tokens).to all(be_a(Integer))
    expect(tokens.each_cons(2).all? { |a, b| b > a }).to be(true)
    expect(tokens.first).to be > 1_600_000_000_000_000 # Redis's clock in microseconds, at the counter's first use
  end

  describe "lock handles" do
    it "try_lock, owned?, refresh, release, as the real ones" do
      lock = locker.try_lock("handle", timeout: 0.5)
      other = Thread.new { elsewhere.try_lock("handle") }.value
      refreshed = lock.refresh(2)
      sleep 0.6

      expect(lock).to be_a(LockManager::Lock)
      expect(lock.token).to match(%r{\A[A-Za-z0-9._-]+/#{Process.pid}/\d+/\d{13}/\h{16}\z}) # as the extension writes it
      expect(other).to be_nil
      expect([refreshed, lock.owned?, locker.locked?("handle")]).to eq([true, true, true])
      expect(lock.release).to be(true)
      expect([lock.owned?, lock.release, lock.refresh(1)]).to eq([false, false, false])
    end

    it "a handle whose timeout passed is no longer owned, and its key is free" do
      lock = locker.try_lock("handle", timeout: 0.1)
      sleep 0.15

      expect(lock.owned?).to be(false)
      expect(Thread.new { elsewhere.try_lock("handle") }.value).to be_a(LockManager::Lock)
      expect(lock.release).to be(false)
    end
  end
end

# Claims, what the job integrations' uniqueness rests on (claim.lua and the extension's adopt, holder and
# release_claim), whichever backend serves them; the including group gives `locker` and `await_queued`.
RSpec.shared_examples "claims of a lock backend" do
  it "claims free keys for their tokens, and refuses a held one with the holder's token" do
    first = locker.claim(%w[job:1 job:2], %w[jid-a jid-b], [60, 60])
    refused = locker.claim(%w[job:1 job:3], %w[jid-c jid-c], [60, 60])

    expect(first).to all(be_a(Integer))
    expect(refused.first).to eq("jid-a")
    expect(refused.last).to be_a(Integer)
    expect(%w[job:1 job:2 job:3].map { |key| locker.holder(key) }).to eq(%w[jid-a jid-b jid-c])
    expect(locker.holder("job:4")).to be_nil
  end

  it "takes a key its own token holds again: a new fencing token and the new TTL" do
    first = locker.claim(["job:1"], ["jid-a"], [0.1]).first
    again = locker.claim(["job:1"], ["jid-a"], [60]).first
    sleep 0.15
    held_after_first_ttl = locker.holder("job:1")
    locker.claim(["job:1"], ["jid-a"], [0.05])
    sleep 0.1

    expect(again).to be > first
    expect(held_after_first_ttl).to eq("jid-a")
    expect(locker.holder("job:1")).to be_nil # the shorter TTL of the last claim
  end

  it "lets a claim expire after its TTL, then another token takes the key" do
    locker.claim(["job:1"], ["jid-a"], [0.1])
    sleep 0.15

    expect(locker.claim(["job:1"], ["jid-b"], [60]).first).to be_a(Integer)
    expect(locker.holder("job:1")).to eq("jid-b")
  end

  it "refuses mismatched arguments as the extension does" do
    expect { locker.claim(%w[a b], ["jid"], [60, 60]) }
      .to raise_error(ArgumentError, "claim: as many tokens and TTLs as keys")
    expect { locker.claim(["a"], [1], [60]) }.to raise_error(ArgumentError, /token must be a String/)
  end

  it "release_claim deletes only the claim of its own token" do
    locker.claim(["job:1"], ["jid-a"], [60])

    expect(locker.release_claim("job:1", "jid-b")).to be(false)
    expect(locker.holder("job:1")).to eq("jid-a")
    expect(locker.release_claim("job:1", "jid-a")).to be(true)
    expect([locker.holder("job:1"), locker.locked?("job:1")]).to eq([nil, false])
  end

  it "release_claims deletes, in one call, each claim its own token holds and no other" do
    locker.claim(%w[job:1 job:2 job:3], %w[jid-a jid-b jid-c], [60, 60, 60])

    released = locker.release_claims(%w[job:1 job:2 job:4], %w[jid-a jid-other jid-d])

    expect(released).to eq([true, false, false])
    expect(%w[job:1 job:2 job:3].map { |key| locker.holder(key) }).to eq([nil, "jid-b", "jid-c"])
    expect(locker.release_claims([], [])).to eq([])
    expect { locker.release_claims(%w[job:2], []) }.to raise_error(ArgumentError, /as many tokens as keys/)
  end

  it "release_claims hands a released claim to the waiter queued for its key" do
    locker.claim(%w[job:1 job:2], %w[jid-a jid-b], [60, 60])
    waiter = Thread.new { locker.blocking_lock("job:2", timeout: 5) { :waited } }
    await_queued(waiter, "job:2", 1)

    expect(locker.release_claims(%w[job:1 job:2], %w[jid-a jid-b])).to eq([true, true])
    expect(waiter.value).to eq(:waited)
  end

  it "adopt takes a claim over: the same token, renewed past its timeout, until released" do
    claimed = locker.claim(["job:1"], ["jid-a"], [60]).first
    lock = locker.adopt("job:1", "jid-a", timeout: 0.1)
    sleep 0.2

    expect(lock).to be_a(LockManager::Lock)
    expect(lock.token).to eq("jid-a")
    expect(lock.fencing_token).to be > claimed
    expect([lock.owned?, lock.lost?, locker.holder("job:1")]).to eq([true, false, "jid-a"])
    expect(lock.release).to be(true)
    expect(locker.holder("job:1")).to be_nil
  end

  it "adopt takes a free key, and returns the holder's token when another holds it" do
    locker.claim(["job:2"], ["jid-b"], [60])

    free = locker.adopt("job:1", "jid-a")
    held = Thread.new { locker.adopt("job:2", "jid-c") }.value

    expect(free).to be_a(LockManager::Lock)
    expect(held).to eq("jid-b")
  end

  it "keep stops the renewal and leaves the claim for its token to adopt again (a retry)" do
    locker.claim(["job:1"], ["jid-a"], [60])
    lock = locker.adopt("job:1", "jid-a", timeout: 30)

    expect(lock.keep(5)).to be(true)
    again = Thread.new { locker.adopt("job:1", "jid-a") }.value
    refused = Thread.new { locker.adopt("job:1", "jid-b") }.value
    again.release

    expect(again).to be_a(LockManager::Lock)
    expect(refused).to eq("jid-a")
  end

  it "lets a kept claim expire after the time it was kept for" do
    lock = locker.adopt("job:1", "jid-a", timeout: 30)
    lock.keep(0.1)
    sleep 0.15

    expect(locker.holder("job:1")).to be_nil
    expect(lock.lost?).to be(false) # its renewal stopped before: nothing watches it any more
  end

  it "a renewed adoption ends at max_hold" do
    lock = locker.adopt("job:1", "jid-a", timeout: 0.1, max_hold: 0.5)
    sleep 0.2
    before = lock.lost?
    sleep 0.4

    expect([before, lock.lost?, locker.holder("job:1")]).to eq([false, true, nil])
  end

  it "raises AlreadyHeld for a thread adopting a key it holds, as the extension does" do
    locker.adopt("job:1", "jid-a")

    expect { locker.adopt("job:1", "jid-a") }.to raise_error(LockManager::AlreadyHeld)
  end

  it "hands a released claim to a blocking waiter" do
    locker.claim(["job:1"], ["jid-a"], [30])
    waiter = Thread.new { locker.blocking_lock("job:1", timeout: 5) { :waited } }
    await_queued(waiter, "job:1", 1)

    locker.release_claim("job:1", "jid-a")

    expect(waiter.value).to eq(:waited)
  end
end

# `await_queued` for the fake, whose waiter is queued once its thread sleeps in the wait.
module FakeQueuedWaiters
  def await_queued(waiter, _key, _count)
    eventually { waiter.status == "sleep" }
  end
end
