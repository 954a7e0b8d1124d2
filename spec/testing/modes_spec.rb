# frozen_string_literal: true

require "spec_helper"
require "lock_manager/testing"

# Switching every Locker between Redis, the fake and no locking at all.
RSpec.describe LockManager::Testing do
  after { described_class.real! }

  it "is real until switched, and says which mode it is in" do
    expect(described_class.mode).to eq(:real)
    expect(described_class.fake!).to eq(:fake)
    expect(described_class.mode).to eq(:fake)
    expect(described_class.disable!).to eq(:disabled)
    expect(described_class.mode).to eq(:disabled)
    expect(described_class.real!).to eq(:real)
    expect(LockManager.testing_backend).to be_nil
  end

  it "switches every Locker: the shared one, and those built before and after" do
    configure_shared_locker!
    before = LockManager::Locker.new(redis_url: redis_url, key_prefix: prefix)
    LockManager::Locker.instance
    described_class.fake!
    after = LockManager::Locker.new(redis_url: redis_url, key_prefix: prefix)

    LockManager::Locker.nonblocking_lock("shared") do
      expect(Thread.new { [before.locked?("shared"), after.locked?("shared")] }.value).to eq([true, true])
    end
    before.try_lock("fake-only", timeout: 30)

    expect(redis.keys("#{prefix}*")).to be_empty # nothing reached Redis
    described_class.real!
    expect(before.locked?("fake-only")).to be(false)
  end

  describe "block forms" do
    it "fake { } runs the block faked and restores the mode before it" do
      inside = described_class.fake { [described_class.mode, :value] }

      expect(inside).to eq(%i[fake value])
      expect(described_class.mode).to eq(:real)
    end

    it "restore the previous mode when nested, and when the block raises" do
      described_class.disable!
      modes = described_class.fake do
        [described_class.mode, described_class.disable { described_class.mode },
         described_class.real { described_class.mode }, described_class.mode]
      end
      expect { described_class.fake { raise ArgumentError, "boom" } }.to raise_error(ArgumentError, "boom")

      expect(modes).to eq(%i[fake disabled real fake])
      expect(described_class.mode).to eq(:disabled)
    end

    it "keep the fake's locks across blocks (reset! forgets them)" do
      described_class.fake { LockManager::Locker.new.claim(["job"], ["jid-a"], [60]) }
      held = described_class.fake { LockManager::Locker.new.holder("job") }
      described_class.reset!

      expect(held).to eq("jid-a")
      expect(described_class.fake { LockManager::Locker.new.holder("job") }).to be_nil
    end

    it "need a block" do
      expect { described_class.fake }.to raise_error(ArgumentError, "a block is required")
    end
  end

  describe ".disable!" do
    let(:locker) { LockManager::Locker.new }

    before { described_class.disable! }

    it "grants every lock at once: two threads hold the same key together" do
      inside = Queue.new
      both = Queue.new
      threads = Array.new(2) do
        Thread.new do
          locker.blocking_lock("report", timeout: 30) do
            inside << true
            both.pop
          end
        end
      end
      2.times { inside.pop }
      2.times { both << true }

      expect(threads.map(&:value)).to eq([true, true])
    end

    it "returns well-formed Results with growing fencing tokens, even nested in one thread" do
      outer = locker.nonblocking_lock("report", renew: true) do |running|
        [running.lost?, locker.nonblocking_lock("report") { :inner }]
      end
      inner = outer.result.last

      expect([outer.run?, outer.lost?, outer.result.first]).to eq([true, false, false])
      expect([inner.run?, inner.result, inner.lost?]).to eq([true, :inner, false])
      expect(inner.fencing_token).to be > outer.fencing_token
      expect(locker.blocking_lock("report", limit: 2) { :blocking }).to eq(:blocking)
    end

    it "hands out lock handles and claims, and holds nothing" do
      lock = locker.try_lock("report")
      waited = locker.lock("report")
      claimed = locker.claim(%w[job job], %w[jid-a jid-b], [60, 60])
      adopted = locker.adopt("job", "jid-c")

      expect([lock, waited, adopted]).to all(be_a(LockManager::Lock))
      expect([lock.owned?, lock.lost?, lock.refresh(5), lock.keep(5), lock.release])
        .to eq([true, false, true, true, true])
      expect(claimed).to all(be_a(Integer))
      expect(adopted.token).to eq("jid-c")
      expect([locker.locked?("report"), locker.holder("job"), locker.release_claim("job", "jid-a")])
        .to eq([false, nil, true])
      expect { locker.claim(["a"], [], [1]) }.to raise_error(ArgumentError)
    end
  end
end
