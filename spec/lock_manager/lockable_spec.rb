# frozen_string_literal: true

require "spec_helper"
require "active_record"
require "tmpdir"

RSpec.describe LockManager::Lockable do
  let(:helper) { Class.new { include LockManager::Lockable }.new }
  let(:lock_key) { "#{prefix}semaphore_lock:lesson:1" }

  before { configure_shared_locker! }

  describe "#with_semaphore_lock" do
    it "yields :locked with the fencing token, or :skipped and nil while another holds the key" do
      seen = []
      helper.with_semaphore_lock("lesson:1") do |status, token|
        seen << [status, token.class]
        Thread.new { helper.with_semaphore_lock("lesson:1") { |*inner| seen << inner } }.join
      end

      expect(seen).to eq([[:locked, Integer], [:skipped, nil]])
      expect(redis.exists?(lock_key)).to be(false)
    end

    it "waits: true (up to ttl) or wait: seconds, then :skipped" do
      elsewhere.try_lock("semaphore_lock:w", timeout: 0.3)
      took = elapsed { expect(helper.with_semaphore_lock("w", ttl: 5, wait: true) { |s| s }).to eq(:locked) }
      expect(took).to be_between(0.2, 1.0) # woken when the other lock expired

      elsewhere.try_lock("semaphore_lock:w2", timeout: 5)
      took = elapsed { expect(helper.with_semaphore_lock("w2", wait: 0.2) { |s| s }).to eq(:skipped) }
      expect(took).to be_between(0.2, 1.0)
    end

    it "limit: N lets N holders in at once" do
      statuses = Queue.new
      gate = Queue.new
      threads = Array.new(3) do
        Thread.new do
          helper.with_semaphore_lock("pool", limit: 2) do |status|
            statuses << status
            gate.pop if status == :locked
          end
        end
      end
      seen = Array.new(3) { statuses.pop }
      2.times { gate << true }
      threads.each(&:join)
      expect(seen.sort).to eq(%i[locked locked skipped])
    end

    it "renew: keeps the lock while the block outlives its ttl" do
      lost = helper.with_semaphore_lock("long", ttl: 0.3, renew: true) do
        sleep 0.6
        redis.exists?("#{prefix}semaphore_lock:long")
      end
      expect(lost).to be(true)
    end

    it "checks release: and limit: with after_commit" do
      expect { helper.with_semaphore_lock("k", release: :later) {} }.to raise_error(ArgumentError, /release must be/)
      expect { helper.with_semaphore_lock("k", release: :after_commit, limit: 2) {} }
        .to raise_error(ArgumentError, /after_commit takes limit: 1/)
      expect { helper.with_semaphore_lock("") {} }.to raise_error(ArgumentError, /key must not be empty/)
    end

    it "with_lock is the same method where nothing else defines one" do
      expect(helper.with_lock("alias") { |status, token| [status, token.class] }).to eq([:locked, Integer])
    end
  end

  describe "with ActiveRecord (SQLite)" do
    before(:all) do
      @dir = Dir.mktmpdir
      ActiveRecord::Base.establish_connection(adapter: "sqlite3", database: File.join(@dir, "lockable.sqlite3"))
      ActiveRecord::Base.connection.create_table(:bookings) { |t| t.string :slot }
    end

    after(:all) do
      ActiveRecord::Base.remove_connection
      FileUtils.remove_entry(@dir)
    end

    let(:booking_class) do
      Class.new(ActiveRecord::Base) do
        self.table_name = "bookings"
        include LockManager::Lockable

        def self.name
          "Booking"
        end
      end
    end

    it "never shadows ActiveRecord's with_lock (a row lock) in a model, and with_semaphore_lock still works" do
      booking = booking_class.create!(slot: "a")
      expect(booking.with_lock { booking.slot }).to eq("a") # ActiveRecord's: reloads with a row lock
      expect(booking.with_semaphore_lock("booking:#{booking.id}") { |status| status }).to eq(:locked)
      expect(booking_class.instance_method(:with_lock).owner).to eq(ActiveRecord::Locking::Pessimistic)
    end

    it "included through an app's own module, ActiveRecord's with_lock still wins" do
      stack = Module.new { include LockManager::Lockable }
      model = Class.new(booking_class) { include stack }
      booking = model.create!(slot: "m")
      expect(booking.with_lock { booking.slot }).to eq("m") # a row lock: no key argument
      expect(redis.keys("#{prefix}*")).to eq([])
    end

    it "release: :after_commit keeps the lock until the transaction commits" do
      held_in_block = held_after_block = nil
      ActiveRecord::Base.transaction do
        helper.with_semaphore_lock("lesson:1", release: :after_commit) do |status|
          held_in_block = [status, redis.exists?(lock_key)]
        end
        held_after_block = redis.exists?(lock_key)
        expect(Thread.new { helper.with_semaphore_lock("lesson:1") { |s| s } }.value).to eq(:skipped)
      end

      expect(held_in_block).to eq([:locked, true])
      expect(held_after_block).to be(true)
      expect(redis.exists?(lock_key)).to be(false)
    end

    it "release: :after_commit releases on rollback too, and right after the block outside a transaction" do
      ActiveRecord::Base.transaction do
        helper.with_semaphore_lock("lesson:1", release: :after_commit) { booking_class.create!(slot: "b") }
        raise ActiveRecord::Rollback
      end
      expect(redis.exists?(lock_key)).to be(false)
      expect(booking_class.where(slot: "b").count).to eq(0)

      helper.with_semaphore_lock("lesson:1", release: :after_commit) { |status| status }
      expect(redis.exists?(lock_key)).to be(false)
    end

    it "release: :after_commit with a nested transaction (a savepoint) keeps the lock to the outer commit" do
      ActiveRecord::Base.transaction do
        ActiveRecord::Base.transaction(requires_new: true) do
          helper.with_semaphore_lock("lesson:1", release: :after_commit) { :locked }
        end
        expect(redis.exists?(lock_key)).to be(true)
      end
      expect(redis.exists?(lock_key)).to be(false)
    end
  end
end
