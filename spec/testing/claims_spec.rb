# frozen_string_literal: true

require "spec_helper"
require "lock_manager/testing/rspec"

# Claims under LockManager::Testing.fake!: what the job integrations' uniqueness rests on, with the
# semantics of claim.lua and the extension's adopt / holder / release_claim.
RSpec.describe "LockManager::Testing.fake! claims", lock_manager: :fake do
  let(:locker) { LockManager::Locker.new }

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
    sleep 0.1

    locker.release_claim("job:1", "jid-a")

    expect(waiter.value).to eq(:waited)
  end
end
