# frozen_string_literal: true

require "spec_helper"

# Every bad input is an ArgumentError naming the argument, raised before anything reaches
# Redis: the locker below points at a port where nothing listens, so reaching Redis would
# surface as ConnectionError instead.
RSpec.describe "Bad input" do
  let(:locker) { LockManager::Locker.new(redis_url: closed_url) }

  bad_keys = [nil, "", :"", 42, 1.5, [], {}, Object.new].freeze
  bad_timeouts = [0, -1, -0.5, 0.0, Float::NAN, Float::INFINITY, "30", nil, true, 2**70, Rational(-1, 2),
                  ((2**52) / 1000) + 1, 1e300, Rational(2**60)].freeze

  bad_keys.each do |key|
    it "rejects the key #{key.inspect} in every method" do
      calls = [
        -> { locker.nonblocking_lock(key) {} },
        -> { locker.blocking_lock(key) {} },
        -> { locker.try_lock(key) },
        -> { locker.lock(key) },
        -> { locker.locked?(key) }
      ]
      calls.each { |call| expect(&call).to raise_error(ArgumentError, /key/) }
    end
  end

  bad_timeouts.each do |timeout|
    it "rejects the timeout #{timeout.inspect}" do
      calls = [
        -> { locker.nonblocking_lock("k", timeout: timeout) {} },
        -> { locker.blocking_lock("k", timeout: timeout) {} },
        -> { locker.try_lock("k", timeout: timeout) },
        -> { locker.lock("k", timeout: timeout) }
      ]
      calls.each { |call| expect(&call).to raise_error(ArgumentError, /timeout/) }
    end
  end

  it "rejects a refresh to a bad number of seconds" do
    server = own_server
    lock = LockManager::Locker.new(redis_url: server.url).try_lock("k")
    server.stop # a refresh that reached Redis now would be a ConnectionError
    expect { lock.refresh(0) }.to raise_error(ArgumentError, /seconds/)
    expect { lock.refresh("10") }.to raise_error(ArgumentError, /seconds/)
    expect { lock.refresh(10) }.to raise_error(LockManager::ConnectionError)
  end

  it "requires a block for the block forms" do
    expect { locker.nonblocking_lock("k") }.to raise_error(ArgumentError, /block/)
    expect { locker.blocking_lock("k") }.to raise_error(ArgumentError, /block/)
    expect { LockManager::Locker.nonblocking_lock("k") }.to raise_error(ArgumentError, /block/)
  end

  it "rejects unknown keyword arguments" do
    expect { locker.nonblocking_lock("k", ttl: 3) {} }.to raise_error(ArgumentError, /ttl/)
  end

  it "names the allowed range of every number" do
    expect { locker.nonblocking_lock("k", timeout: 2**60) {} }
      .to raise_error(ArgumentError, /timeout must be a positive number of seconds up to 4503599627370/)
    expect { locker.nonblocking_lock("k", limit: 2**40) {} }
      .to raise_error(ArgumentError, /limit must be an Integer from 1 to 4294967295, got 1099511627776/)
    expect { LockManager::Locker.new(pool_size: 2**40) }
      .to raise_error(ArgumentError, /pool_size must be an Integer from 1 to 65535/)
    expect { locker.nonblocking_lock("k", renew: true, max_hold: 1e20) {} }.to raise_error(ArgumentError, /max_hold/)
  end

  it "reaches Redis (and fails there) once the arguments are right" do
    expect { locker.nonblocking_lock("k") {} }.to raise_error(LockManager::ConnectionError)
  end

  describe "Locker.new" do
    {
      pool_size: [0, -1, 1.5, "5", nil, 2**40, 65_536],
      pool_timeout: [0, -1, "5", Float::NAN, 2**62],
      connect_timeout: [0, Float::INFINITY, nil],
      read_timeout: [-1, "1"],
      retry_interval: [0, :fast],
      key_prefix: [nil, 5, :lock]
    }.each do |option, values|
      values.each do |value|
        it "rejects #{option}: #{value.inspect}, naming it" do
          expect { LockManager::Locker.new(option => value) }.to raise_error(ArgumentError, /#{option}/)
        end
      end
    end

    ["http://127.0.0.1:6379", "127.0.0.1:6379", "", "tcp://x", nil, 6379].each do |url|
      it "rejects the redis_url #{url.inspect}" do
        expect { LockManager::Locker.new(redis_url: url) }.to raise_error(ArgumentError, /redis_url/)
      end
    end

    it "never repeats a password in its messages" do
      %w[http://user:s3cret@host:1 redis://:s3cret@host:notaport/0].each do |url|
        expect { LockManager::Locker.new(redis_url: url) }.to raise_error(ArgumentError) { |e|
          expect(e.message).not_to include("s3cret")
        }
      end
    end

    it "rejects unknown options" do
      expect { LockManager::Locker.new(size: 3) }.to raise_error(ArgumentError, /size/)
    end

    it "accepts redis://, rediss:// and unix:// URLs without connecting" do
      %w[redis://127.0.0.1:1/0 rediss://127.0.0.1:1/0 unix:///tmp/nowhere.sock].each do |url|
        expect(LockManager::Locker.new(redis_url: url).pool_state).to eq([0, 0])
      end
    end
  end

  describe "LockManager.configure" do
    it "rejects a bad setting, naming it, and keeps the previous settings" do
      LockManager.configure { |c| c.pool_size = 3 }
      expect { LockManager.configure { |c| c.pool_size = 0 } }.to raise_error(ArgumentError, /pool_size/)
      expect(LockManager.config.pool_size).to eq(3)
    end
  end
end
