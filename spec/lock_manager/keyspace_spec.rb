# frozen_string_literal: true

require "spec_helper"
require_relative "../support/monitor"

# No user key reaches the gem's own keys, and every key one command touches lies in the lock's
# Redis Cluster hash slot, whatever the key.
RSpec.describe "The keyspace" do
  let(:locker) { new_locker }
  let(:other) { new_locker }

  odd = ["x", "x:queue", "x:waiters", "lock_manager:fencing_token", "{x}", "{x}:queue", "}{x}", "{}", "a{}b{c}",
         "{", "}", "lock_manager:{0}:queue:lock:x", "\xFF\x00{\n}".b, "process:1", "*?[]\\"].freeze

  def random_key(rng)
    pieces = ["{", "}", ":queue", ":waiters", "lock_manager:", "fencing_token", "x", "y", "\x00".b, "\xFF".b,
              ":", "process:", "*", rng.rand(1000).to_s]
    Array.new(rng.rand(1..5)) { pieces.sample(random: rng) }.join.b
  end

  it "refuses key prefixes that would reach the gem's own keys, at configuration" do
    ["", "lock_manager:", "lock_manager:mine:", "lock_", "l"].each do |bad|
      expect { LockManager.configure { |c| c.key_prefix = bad } }.to raise_error(ArgumentError, /key_prefix/)
      expect { LockManager::Locker.new(redis_url: redis_url, key_prefix: bad) }.to raise_error(ArgumentError)
    end
    expect(LockManager.config.key_prefix).to eq("lock:")
    expect { LockManager.configure { |c| c.key_prefix = "lock_managers:" } }.not_to raise_error
  end

  it "locking one key of 2,000 random pairs never disturbs the other (held, as a semaphore, or queued)" do
    rng = Random.new(Integer(ENV.fetch("SEED", "20261123")))
    pairs = Array.new(2_000) { [random_key(rng), random_key(rng)] } + odd.permutation(2).to_a
    disturbed = pairs.reject { |a, b| a == b }.filter_map do |a, b|
      held = locker.try_lock(a, timeout: 30)
      token = redis.get("#{prefix}#{a}")
      plain = other.nonblocking_lock(b) { :ran }
      shared = other.nonblocking_lock(b, limit: 2) { other.nonblocking_lock(b, limit: 2) { :both } }
      intact = redis.get("#{prefix}#{a}") == token && held.owned?
      released = held.release
      [a, b] unless plain.result == :ran && shared.result&.result == :both && intact && released
    end
    expect(disturbed).to eq([])
    expect(held_keys(redis, "#{prefix}*")).to eq([])
  end

  it "a lock named like another's queue, waiters or counter, held while that one is contended, " \
     "disturbs nothing" do
    odd.each do |name|
      holder = locker.try_lock(name, timeout: 30)
      waiter = Thread.new { other.blocking_lock(name, timeout: 10) { :waited } }
      eventually { redis.zcard(queue_key("#{prefix}#{name}")) == 1 }
      lookalikes = (%W[#{name}:queue #{name}:waiters lock_manager:fencing_token] - [name]).map do |key|
        [locker.nonblocking_lock(key) { :plain }.result, locker.nonblocking_lock(key, limit: 2) { :shared }.result]
      end
      expect(lookalikes).to all(eq(%i[plain shared]))
      expect(holder.release).to be(true)
      expect(waiter.value).to eq(:waited)
    end
    expect(held_keys(redis, "#{prefix}*")).to eq([])
  end

  # Every command of a lock cycle, in every mode, as Redis ran it (scripts' own commands too):
  # its keys lie in one hash slot, the lock's.
  it "sends no command whose keys span two hash slots, in any mode" do
    server = own_server # no other example's background traffic in what MONITOR sees
    locker = LockManager::Locker.new(redis_url: server.url, key_prefix: prefix)
    other = LockManager::Locker.new(redis_url: server.url, key_prefix: prefix)
    keys = ["plain", "{tag}x", "}{x}", "a{}b", "\xFF{\x00}".b, "lock_manager:{1}:queue:x", "x:queue"]
    commands = CommandRecorder.new(server.url).record do
      keys.each do |key|
        locker.nonblocking_lock(key) {}
        contend(other, key) # blocking waiters queue and are handed the lock
        contend(other, key, fair: true)
        contend(other, key, limit: 2, holders: 3)
        locker.nonblocking_lock(key, timeout: 0.3, renew: true) { sleep 0.25 } # renewed once at least
        handle = locker.try_lock(key)
        handle.refresh(10)
        handle.owned?
        handle.release
        locker.lock(key, timeout: 1).release
      end
    end
    spanning = commands.reject { |command| command.keys.map { |key| KeySlots.slot(key) }.uniq.size <= 1 }
    expect(spanning).to eq([])
    names = commands.map(&:name).uniq
    expect(names).to include("EVALSHA", "SET", "INCR", "ZADD", "HSET")
    scripted = commands.select(&:in_script).flat_map(&:keys)
    expect(scripted).not_to be_empty
    # Inside scripts too: every key a script touched is in the slot of the lock it was about.
    lock_slots = keys.map { |key| KeySlots.slot("#{prefix}#{key}") }
    expect(scripted.map { |key| KeySlots.slot(key) } - lock_slots).to eq([])
  end

  def contend(other, key, fair: false, limit: 1, holders: 2)
    threads = Array.new(holders) do
      Thread.new { other.blocking_lock(key, timeout: 5, fair: fair, limit: limit) { sleep 0.02 } }
    end
    threads.each(&:join)
  end

  # Numbers reach Lua as decimal integers: a waiter whose timeout is 1e11 s (1e14 ms, which Lua
  # would write "1e+14") keeps its place and is handed the lock; Rationals and the largest timeout
  # work too.
  it "queues and hands over with the largest timeouts and with Rationals" do
    [1e11, Rational(3, 2), (2**52) / 1000].each do |timeout|
      holder = locker.try_lock("big", timeout: 30)
      waiter = Thread.new { other.blocking_lock("big", timeout: timeout) { redis.pttl("#{prefix}big") } }
      eventually { redis.zcard(queue_key("#{prefix}big")) == 1 }
      entry = redis.hvals(waiters_key("#{prefix}big")).first
      expect(entry).to match(/\A\d+:\d+:/)
      sleep 0.6 # it has renewed its place at least once
      expect(redis.zcard(queue_key("#{prefix}big"))).to eq(1)
      expect(holder.release).to be(true)
      expect(waiter.value).to be > 0
    end
  end

  # During a rolling deploy, processes of the previous release lock the same keys. It took a lock
  # with SET key token NX PX (and released it with a compare-and-delete of its own token): the
  # lock key and its value are unchanged, so both exclude each other.
  it "excludes, and is excluded by, a process of the previous release locking the same key" do
    key = "#{prefix}deploy"
    old_token = SecureRandom.uuid
    expect(redis.set(key, old_token, nx: true, px: 30_000)).to be(true) # the previous release's acquire
    expect(locker.nonblocking_lock("deploy") { :ran }.run?).to be(false)
    expect(locker.try_lock("deploy")).to be_nil
    waiter = Thread.new { locker.blocking_lock("deploy", timeout: 5) { redis.get(key) } }
    sleep 0.3
    expect(redis.get(key)).to eq(old_token) # never deleted or extended by this release
    compare_and_delete = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"
    expect(redis.eval(compare_and_delete, keys: [key], argv: [old_token])).to eq(1) # its release
    ours = waiter.value
    expect(ours).not_to eq(old_token)
    held = locker.try_lock("deploy")
    expect(redis.set(key, SecureRandom.uuid, nx: true, px: 30_000)).to be(false) # the old one is kept out
    expect(redis.eval(compare_and_delete, keys: [key], argv: [old_token])).to eq(0)
    expect(held.release).to be(true)
  end
end
