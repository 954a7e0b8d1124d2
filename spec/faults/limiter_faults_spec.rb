# frozen_string_literal: true

require "spec_helper"
require "rbconfig"
require_relative "../support/fault_helpers"
require_relative "../support/process_helpers"

# What a limiter admits when Redis restarts under it, and under many processes at once: the bounds
# docs/limits.md gives.
RSpec.describe "Limiters under faults and load" do
  include FaultHelpers
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

  # 6 processes of 5 threads ask a GCRA limiter (20 a second, burst 5) and a window limiter (30 per
  # hour) as fast as they can for 3 s: the window admits exactly its limit, the rate at most
  # burst + rate × the time, and most of it. The decisions' times are the clients', taken after each
  # reply: late by as long as a loaded machine keeps a thread waiting, never early, so each span is
  # widened by SLACK. (Twice the rate, a burst ignored, would still fail it.)
  it "admits exactly the rule across 6 processes of 5 threads", timeout: 90 do
    slack = 0.25
    script = <<~RUBY
      $stdout.sync = true
      require "lock_manager"
      locker = LockManager::Locker.new(redis_url: ARGV[0], key_prefix: ARGV[1], pool_size: 5)
      api = LockManager::Limiter.new(ARGV[2], rate: 20, per: 1, burst: 5, locker: locker)
      exports = LockManager::Limiter.window(ARGV[2], 30, per: 3600, locker: locker)
      $stdin.gets
      stop = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 3
      times = Array.new(5) do
        Thread.new do
          mine = []
          while Process.clock_gettime(Process::CLOCK_MONOTONIC) < stop
            mine << Process.clock_gettime(Process::CLOCK_MONOTONIC) if api.try_acquire.admitted?
            mine << :export if exports.try_acquire.admitted?
          end
          mine
        end
      end
      puts times.flat_map(&:value).map(&:to_s).join(" ")
    RUBY
    children = Array.new(6) do
      IO.popen([RbConfig.ruby, "-I", File.expand_path("../../lib", __dir__), "-e", script, redis_url, prefix, name],
               "r+")
    end
    children.each { |child| child.puts("go") }
    decisions = children.flat_map { |child| child.read.split }
    children.each(&:close)

    exports, times = decisions.partition { |decision| decision == "export" }
    times = times.map(&:to_f).sort
    span = times.last - times.first
    expect(exports.size).to eq(30)
    expect(times.size).to be <= 5 + (20 * (span + slack)) + 1
    expect(times.size).to be >= 0.9 * (20 * span)
    # Any 1 s of decisions holds at most burst + 20 (+1 for the span's closed ends).
    busiest = times.each_with_index.map { |time, i| times[i..].take_while { |t| t < time + 1 }.size }.max
    expect(busiest).to be <= 5 + (20 * (1 + slack)) + 1
  end
end
