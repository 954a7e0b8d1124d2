# frozen_string_literal: true

require "spec_helper"
require "rbconfig"
require_relative "../support/fault_helpers"
require_relative "../support/limiter_hammer"
require_relative "../support/process_helpers"

# What a limiter admits when Redis restarts under it, and under many processes at once: the bounds
# docs/limits.md gives.
RSpec.describe "Limiters under faults and load" do
  include FaultHelpers
  include LimiterHammer
  include ProcessHelpers

  after { stop_all }

  let(:name) { "limiter:#{SecureRandom.hex(4)}" }

  def limiter_on(server, **rule)
    locker = LockManager::Locker.new(redis_url: server.url, key_prefix: prefix, connect_timeout: 1)
    LockManager::Limiter.new(name, locker: locker, **rule)
  end

  def admitted(limiter, attempts)
    Array.new(attempts) { limiter.try_acquire.admitted? }.count(true)
  end

  it "keeps its count across a restart with appendonly: nothing more is admitted" do
    server = own_server(FaultyRedisServer, appendonly: true)
    exports = limiter_on(server, window: 5, per: 3600)
    expect(admitted(exports, 5)).to eq(5)

    server.restart

    expect(admitted(exports, 3)).to eq(0) # the first call after the restart reconnects
  end

  it "admits at most one more period's worth after a restart that lost its state, as documented" do
    server = own_server(FaultyRedisServer, appendonly: false)
    exports = limiter_on(server, window: 5, per: 3600)
    api = LockManager::Limiter.new("#{name}:api", locker: exports.send(:locker), rate: 1, per: 3600, burst: 3)
    expect([admitted(exports, 6), admitted(api, 4)]).to eq([5, 3])

    server.restart

    expect([admitted(exports, 8), admitted(api, 5)]).to eq([5, 3]) # the window's limit and the burst again
  end

  # A concurrency limiter's place is a lease renewed every timeout / 3 while its block runs: a living
  # holder keeps it past its timeout, and a SIGKILLed one (no release, no more renewals) loses it when
  # the last renewal runs out, at most `timeout` after the kill. MARGIN covers the polling (10 ms) and a
  # loaded 2-core machine.
  it "frees a SIGKILLed holder's concurrency place within its timeout, and keeps a living one's past it",
     timeout: 30 do
    margin = 1.0
    holder = ruby_child(<<~RUBY, { "LM_URL" => redis_url, "LM_PREFIX" => prefix, "LM_NAME" => name })
      $stdout.sync = true
      require "lock_manager"
      locker = LockManager::Locker.new(redis_url: ENV.fetch("LM_URL"), key_prefix: ENV.fetch("LM_PREFIX"))
      LockManager::Limiter.concurrent(ENV.fetch("LM_NAME"), 1, timeout: 2, locker: locker).within_limit do
        puts "inside"
        sleep
      end
    RUBY
    imports = LockManager::Limiter.concurrent(name, 1, timeout: 2, locker: new_locker)
    admitted = lambda do
      imports.within_limit { true }
    rescue LockManager::OverLimit
      false
    end
    expect(holder.gets).to eq("inside")
    entered = monotonic

    refusals = []
    until monotonic - entered > 3.5 # past the timeout: only renewals keep the place
      refusals << !admitted.call
      sleep 0.1
    end
    expect(refusals).to all(be(true))

    holder.kill(:KILL)
    expect(holder.wait).to be_a(Process::Status)
    killed = monotonic
    sleep 0.01 until admitted.call || monotonic - killed > 10
    freed_after = monotonic - killed

    report(refusals: refusals.size, held_for: killed - entered, freed_after: freed_after)
    expect(freed_after).to be <= 2 + margin
    expect(held_keys(redis, "#{prefix}*")).to eq([])
  end

  # Issue 27: processes of threads ask a GCRA limiter (20 a second, burst 5) and a window limiter (30
  # per 2 s) as fast as they can: no set of decisions exceeds burst + rate x its span, no window its
  # limit, and at least 95% of what each rule allows is admitted (spec/support/limiter_hammer.rb).
  # LM_HAMMER=20x10x10 sets processes x threads x seconds.
  it "admits exactly the rule across processes of threads hammering one GCRA and one window limiter", timeout: 120 do
    processes, threads, seconds = ENV.fetch("LM_HAMMER", "20x10x10").split("x").map(&:to_f)
    run = hammer_limiters(locker: { redis_url: redis_url }, names: [name, name], processes: processes.to_i,
                          threads: threads.to_i, seconds: seconds, rule: { rate: 20, burst: 5, window: 30, per: 2 })
    expect_within_the_rules(run, share: 0.95)
  end
end
