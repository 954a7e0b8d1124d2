# frozen_string_literal: true

require "spec_helper"
require_relative "../support/fault_helpers"

# A blocking wait with time left rides out Redis being away, restarting, paused or slow: it keeps
# trying with backoff and takes the lock once Redis answers; and pooled connections that died
# while idle are replaced, not reported.
RSpec.describe "Waiters ride out Redis hiccups" do
  include FaultHelpers

  let(:server) { start_server(args: %w[--enable-debug-command yes]) }
  let(:admin) { client_of(server, timeout: 5) }
  let(:waiters) { 50 }

  after { close_fault_clients }

  # `waiters` threads queue for "k" one after another, behind a holder in another Locker, each
  # recording when it entered its block. @return [Array(Array<Thread>, Queue)]
  def queue_behind_holder(locker, fair:)
    entered = Queue.new
    threads = Array.new(waiters) do |i|
      thread = Thread.new do
        locker.blocking_lock("k", timeout: 30, fair: fair) do
          entered << i
          sleep 0.002
          i
        end
      rescue StandardError => e
        e
      end
      eventually(timeout: 10) { admin.zcard(queue_key("#{prefix}k")) == i + 1 }
      thread
    end
    [threads, entered]
  end

  def holder
    @holder ||= locker_on(server, pool_size: 1).try_lock("k", timeout: 30)
  end

  # Waiters queue behind the holder, then redis-server is SIGKILLed and started again `down` s later.
  # @return [Array(Array<Thread>, Queue)] as #queue_behind_holder
  def queue_across_restart(fair:, down: 1)
    locker = locker_on(server, pool_size: 10)
    holder
    queued = queue_behind_holder(locker, fair: fair)
    server.kill
    sleep down
    server.start
    queued
  end

  # Every waiter entered its block (in arrival order when `ordered`), none raised, nothing is left.
  def expect_every_waiter_served(threads, entered, ordered:)
    values = threads.map { |thread| thread.join(40) && thread.value }
    order = []
    order << entered.pop until entered.empty?
    report(order: order.first(12), errors: values.grep(Exception).map(&:class).tally)
    expect(values).to eq((0...waiters).to_a)
    expect(order).to eq((0...waiters).to_a) if ordered
    expect(held_keys(admin, "#{prefix}*")).to eq([])
  end

  [false, true].each do |fair|
    context(fair ? "fair: true" : "fair: false") do
      it "50 queued waiters across a 1 s restart without persistence: every one gets the lock, none raises" do
        # The holder's lock and the queue are gone with the data: waiters queue anew.
        threads, entered = queue_across_restart(fair: fair)
        expect_every_waiter_served(threads, entered, ordered: false)
        expect(holder.release).to be(false)
      end

      it "50 queued waiters across a 1.5 s DEBUG SLEEP (past read_timeout): all served#{", in order" if fair}" do
        locker = locker_on(server, pool_size: 10, read_timeout: 0.5)
        holder
        threads, entered = queue_behind_holder(locker, fair: fair)
        Thread.new { client_of(server, timeout: 5).call("DEBUG", "SLEEP", "1.5") }.join
        expect(holder.release).to be(true)
        expect_every_waiter_served(threads, entered, ordered: fair)
      end

      it "50 queued waiters across 1.5 s of CLIENT PAUSE WRITE: all served#{", in order" if fair}" do
        locker = locker_on(server, pool_size: 10, read_timeout: 0.5)
        holder
        threads, entered = queue_behind_holder(locker, fair: fair)
        admin.call("CLIENT", "PAUSE", 1500, "WRITE")
        sleep 1.6
        expect(holder.release).to be(true)
        expect_every_waiter_served(threads, entered, ordered: fair)
      end
    end
  end

  context "with --appendonly yes" do
    let(:server) { start_server(appendonly: true) }

    # A place lapses 2 s after its waiter last renewed it (at least every 0.5 s), and the pool reaches
    # Redis within 0.5 s of its return: an outage of 0.5 s leaves a loaded machine room.
    it "50 fair waiters across a 0.5 s restart: the lock and the queue survive, all served in order" do
      # Every write fsynced while 50 waiters come back: the holder's release may wait its turn.
      @holder = locker_on(server, pool_size: 1, connect_timeout: 5, read_timeout: 5).try_lock("k", timeout: 30)
      threads, entered = queue_across_restart(fair: true, down: 0.5)
      sleep 0.6 # every waiter has renewed its place since
      expect(holder.release).to be(true)
      expect_every_waiter_served(threads, entered, ordered: true)
    end
  end

  it "a wait whose deadline passes while Redis is away raises ConnectionError with the last cause, " \
     "not LockNotAcquired" do
    # Connected first, with time to: a loaded run's waiter spent its 1.5 s failing to connect within
    # 0.2 s and never queued. A killed Redis refuses connects at once whatever the timeout.
    locker = locker_on(server, connect_timeout: 1)
    locker.locked?("k")
    holder
    waiter = Thread.new { outcome_and_time { locker.blocking_lock("k", timeout: 1.5) { :ran } } }
    # It waits in the queue (a waiter that ended already says why).
    eventually { admin.zcard(queue_key("#{prefix}k")) == 1 || (!waiter.alive? && raise("waiter: #{waiter.value}")) }
    server.kill
    error, took = waiter.value
    expect(error).to be_a(LockManager::ConnectionError)
    expect(error.message).to include("127.0.0.1:#{server.port}", '"k"')
    expect(took).to be_between(1.4, 4.0)
  end

  it "a non-blocking call still fails fast while Redis is away" do
    locker = locker_on(server, connect_timeout: 0.2)
    locker.nonblocking_lock("warm") {}
    server.kill
    error, took = outcome_and_time { locker.nonblocking_lock("k") { :ran } }
    expect(error).to be_a(LockManager::ConnectionError)
    expect(took).to be < 0.5
  end

  describe "pooled connections that died while idle" do
    # @param thread [Integer] keeps each thread's keys its own
    def hundred_calls(locker, thread = 0)
      Array.new(100) do |i|
        call(locker, i % 5, "#{thread}:#{i}")
      rescue StandardError => e
        e
      end
    end

    def call(locker, kind, key)
      case kind
      when 0 then locker.nonblocking_lock("a#{key}") { :ran }.result
      when 1 then locker.blocking_lock("b#{key}", timeout: 5) { :ran }
      when 2 then locker.try_lock("c#{key}").release && :ran
      when 3 then locker.nonblocking_lock("d#{key}", limit: 2) { :ran }.result
      else locker.locked?("e#{key}") ? :held : :ran
      end
    end

    it "killed by CLIENT KILL: the next 100 calls all succeed" do
      locker = locker_on(server, pool_size: 5)
      fill_pool(locker, 5)
      expect(locker.pool_state).to eq([5, 5])
      pool_client_ids(admin).each { |id| admin.call("CLIENT", "KILL", "ID", id) }
      expect(hundred_calls(locker)).to all(eq(:ran))
    end

    it "closed by a restart: the next 100 calls on every thread succeed" do
      locker = locker_on(server, pool_size: 5)
      fill_pool(locker, 5)
      server.kill
      server.start
      outcomes = Array.new(4) { |thread| Thread.new { hundred_calls(locker, thread) } }.flat_map(&:value)
      expect(outcomes.reject { |outcome| outcome == :ran }).to eq([])
    end

    it "closed by the server's idle timeout: the next calls succeed" do
      locker = locker_on(server, pool_size: 3)
      fill_pool(locker, 3)
      admin.config(:set, "timeout", "1")
      # Redis closes idle clients from its once-a-second cron, counting whole seconds
      eventually(timeout: 6) { pool_client_ids(admin).empty? }
      expect(hundred_calls(locker)).to all(eq(:ran))
    ensure
      admin.config(:set, "timeout", "0")
    end
  end
end
