# frozen_string_literal: true

require "spec_helper"

# Fencing tokens: a number issued with every acquisition, in the same round trip, that only grows
# for a key, even across its expiry, so that storage can refuse a holder whose lock has expired.
RSpec.describe "Fencing tokens" do
  let(:locker) { new_locker }

  it "grows with every acquisition of a key, across its expiry and across lock kinds" do
    tokens = []
    tokens << locker.nonblocking_lock("k") {}.fencing_token
    tokens << locker.blocking_lock("k", &:fencing_token)
    tokens << locker.try_lock("k", timeout: 0.05).fencing_token
    sleep 0.1 # that lock expired without a release: the next number is still higher
    tokens << locker.lock("k").tap(&:release).fencing_token
    tokens << locker.nonblocking_lock("k", limit: 3, &:fencing_token).result

    expect(tokens).to all(be_an(Integer))
    expect(tokens).to eq(tokens.sort.uniq)
  end

  it "gives a block that takes an argument the Result while it runs: the one returned" do
    seen = nil
    result = locker.nonblocking_lock("k") do |lock|
      seen = [lock.run?, lock.result, lock.lost?, lock.fencing_token]
      :done
    end

    expect(seen).to eq([true, nil, false, result.fencing_token])
    expect(result.result).to eq(:done)
    expect(locker.nonblocking_lock("k", &-> { :a_lambda_without_arguments }).result).to eq(:a_lambda_without_arguments)
    expect(locker.nonblocking_lock("k") { |*args| args.size }.result).to eq(1)
  end

  # Result#yield_to tries a lambda that takes no argument twice: its body must still run once.
  it "runs a block that raises ArgumentError once, whether it takes the Result or not" do
    runs = 0
    body = lambda do
      runs += 1
      raise ArgumentError, "from the body"
    end
    [body, proc { body.call }, ->(_result) { body.call }].each do |block|
      expect { locker.nonblocking_lock("k", &block) }.to raise_error(ArgumentError, "from the body")
    end

    expect(runs).to eq(3)
    expect(locker.locked?("k")).to be(false)
  end

  it "is nil when the block did not run" do
    held = elsewhere.try_lock("k")
    expect(locker.nonblocking_lock("k") { raise "not run" }.fencing_token).to be_nil
  ensure
    held&.release
  end

  # The README's pattern: storage keeps the highest token it has seen and refuses older ones.
  it "lets storage refuse the write of a holder whose lock expired while it was paused" do
    accept = "local t = tonumber(redis.call('GET', KEYS[1]) or '0') " \
             "if tonumber(ARGV[1]) <= t then return 0 end " \
             "redis.call('SET', KEYS[1], ARGV[1]) redis.call('SET', KEYS[2], ARGV[2]) return 1"
    write = ->(token, value) { redis.eval(accept, keys: ["#{prefix}fence", "#{prefix}data"], argv: [token, value]) }

    slow = locker.nonblocking_lock("k", timeout: 0.1) do |lock|
      sleep 0.2 # a GC pause: the lock expires meanwhile, and another process takes it and writes
      locker.nonblocking_lock("k") { |other| write.call(other.fencing_token, "new") }
      write.call(lock.fencing_token, "stale")
    end

    expect(slow.lost?).to be(true)
    expect(slow.result).to eq(0) # refused
    expect(redis.get("#{prefix}data")).to eq("new")
  end
end
