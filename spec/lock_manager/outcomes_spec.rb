# frozen_string_literal: true

require "spec_helper"

# Every outcome is told apart: an infrastructure fault is never "not acquired", and a lock lost
# while its block ran is reported.
RSpec.describe "Honest outcomes" do
  let(:server) { RedisServer.new(password: "s3cret-pw").start }
  let(:admin) { server.client }

  after do
    admin.close
    server.shutdown
  end

  def locker(url: server.url, **options)
    LockManager::Locker.new(redis_url: url, key_prefix: prefix, **options)
  end

  it "raises AuthenticationError for a wrong password, never showing a password" do
    error, = timed_error(LockManager::AuthenticationError) { locker(url: server.url(password: "nope")).locked?("k") }
    expect(error.message).not_to include("nope", "s3cret-pw")
    expect(error).not_to be_a(LockManager::ConnectionError)
  end

  it "raises PermissionError when the Redis user may not touch the lock's keys (NOPERM)" do
    admin.call("ACL", "SETUSER", "reporting", "on", ">pw", "~reports:*", "+@all")
    limited = locker(url: "redis://reporting:pw@127.0.0.1:#{server.port}/0")
    expect { limited.nonblocking_lock("k") {} }.to raise_error(LockManager::PermissionError, /NOPERM|permission/i)
  end

  it "raises OutOfMemoryError when Redis refuses writes, and still releases under OOM" do
    l = locker
    lock = l.try_lock("held", timeout: 30)
    admin.config(:set, "maxmemory-policy", "noeviction")
    admin.config(:set, "maxmemory", "1")
    expect { l.nonblocking_lock("k") {} }.to raise_error(LockManager::OutOfMemoryError, /OOM|memory/)
    expect(lock.release).to be(true)
  ensure
    admin.config(:set, "maxmemory", "0")
  end

  it "raises TimeoutError (a ConnectionError) when Redis stops answering, and undoes the acquire it may have made" do
    l = locker(read_timeout: 0.3)
    l.locked?("warm")
    admin.client(:pause, 1000, "ALL") # Redis holds every command for 1 s
    error, took = timed_error(LockManager::TimeoutError) { l.try_lock("k", timeout: 30) }

    expect(error).to be_a(LockManager::ConnectionError)
    expect(error.message).to include("read_timeout", "127.0.0.1:#{server.port}")
    expect(took).to be_between(0.25, 0.9)
    # The SET ran when Redis resumed; the compare-and-delete sent after it on the same
    # connection ran next: no lock is left for its 30 s.
    eventually(timeout: 3) { admin.client(:list).none? { |c| c["flags"].include?("P") } }
    sleep 0.2
    expect(admin.exists?("#{prefix}k")).to be(false)
  end

  describe "a lock lost while its block ran" do
    def lose_the_lock(lock_manager, method, key)
      lock_manager.public_send(method, key, timeout: 0.2) do
        sleep 0.3 # outlives its timeout...
        locker.try_lock(key, timeout: 30) # ...and someone else takes the key
        :the_value
      end
    end

    it "is reported by Result#lost?, logged once (on_lost: :warn, the default)" do
      log = StringIO.new
      LockManager.configure { |c| c.logger = Logger.new(log) }
      result = lose_the_lock(locker, :nonblocking_lock, "k")

      expect(result.run?).to be(true)
      expect(result.lost?).to be(true)
      expect(result.result).to eq(:the_value)
      expect(log.string.lines.grep(/lost/).size).to eq(1)
      expect(log.string).to include('"k"', "0.2s")
      expect(locker.nonblocking_lock("free") {}.lost?).to be(false)
    end

    it "raises LockLost after the block with on_lost: :raise, carrying the block's value" do
      strict = locker(on_lost: :raise)
      %i[nonblocking_lock blocking_lock].each_with_index do |method, i|
        expect { lose_the_lock(strict, method, "k#{i}") }.to raise_error(LockManager::LockLost) { |e|
          expect(e.key).to eq("k#{i}")
          expect(e.value).to eq(:the_value)
          expect(e.ran_for).to be_between(0.3, 1)
        }
      end
      expect { locker(on_lost: :maybe) }.to raise_error(ArgumentError, /on_lost/)
    end

    it "says why when the block ended within its timeout: Redis lost the lock, the clock did not" do
      strict = locker(on_lost: :raise)
      gone = lambda do
        strict.nonblocking_lock("wiped", timeout: 30) { admin.del("#{prefix}wiped") } # a failover, a restart...
      end
      expect(&gone).to raise_error(LockManager::LockLost, /within its timeout of 30.0s, but the lock was gone/)
      expect { lose_the_lock(strict, :nonblocking_lock, "late") }.to raise_error(LockManager::LockLost,
                                                                                 /longer than its timeout of 0.2s/)
    end

    it "never deletes the new holder's lock" do
      lose_the_lock(locker, :nonblocking_lock, "k")
      expect(admin.exists?("#{prefix}k")).to be(true)
    end
  end
end
