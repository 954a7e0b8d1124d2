# frozen_string_literal: true

require "spec_helper"
require_relative "../support/fault_helpers"

# Faults of a real redis-server: each example starts a private one on a free loopback port, and
# kills (SIGKILL), stops (SIGSTOP), pauses (CLIENT PAUSE) or restarts it, kills its clients, or
# interrupts the gem's threads at random. Each example checks that nothing was lost, that no call
# waited past its bound (bounds are generous: the suite runs on a busy 2-core machine), and that
# no other holder's lock was touched.
RSpec.describe "Redis faults" do
  include FaultHelpers

  let(:server) { start_server }
  let(:admin) { client_of(server, timeout: 5) } # CLIENT PAUSE holds it too: it waits the pause out
  let(:address) { "127.0.0.1:#{server.port}" }

  after { close_fault_clients }

  def key_of(key)
    "#{prefix}#{key}"
  end

  def expect_connection_error(outcome, key, within:)
    error, took = outcome
    expect(error).to be_a(LockManager::ConnectionError), "expected a ConnectionError, got #{error.inspect}"
    expect(error).not_to be_a(LockManager::LockNotAcquired)
    expect(error.message).to include(key.inspect, address)
    expect(took).to be < within
  end

  # Another holder's lock is exactly as it was: same token, still counting down from its TTL.
  def expect_untouched(lock, ttl: 60)
    expect(admin.get(key_of(lock.key))).to eq(lock.token)
    expect(admin.pttl(key_of(lock.key))).to be_between(1, ttl * 1000)
  end

  describe "redis-server killed with SIGKILL, then restarted on the same port" do
    it "(a) before an acquire: each call raises ConnectionError naming host:port and key (a wait at its deadline); " \
       "the Locker works again" do
      locker = locker_on(server, pool_size: 2, connect_timeout: 0.5, pool_timeout: 1)
      Array.new(2) { |i| Thread.new { 20.times { locker.nonblocking_lock("warm#{i}") { sleep 0.001 } } } }.each(&:join)
      server.kill

      ran = []
      calls = {
        "a1" => -> { locker.nonblocking_lock("a1") { ran << :nonblocking_lock } },
        "a2" => -> { locker.try_lock("a2") },
        "a3" => -> { locker.blocking_lock("a3", timeout: 1) { ran << :blocking_lock } },
        "a4" => -> { locker.lock("a4", timeout: 1) },
        "a5" => -> { locker.locked?("a5") }
      }
      outcomes = calls.transform_values { |call| outcome_and_time(&call) }
      outcomes.each { |key, outcome| expect_connection_error(outcome, key, within: 2.5) }
      expect(ran).to eq([])

      server.start
      other = foreign_lock(server, "other")
      back_in = elapsed { expect(once_back(within: 2) { locker.nonblocking_lock("a1") { :back } }.result).to eq(:back) }
      took = elapsed do
        expect(locker.try_lock("a2", timeout: 5).release).to be(true)
        expect(locker.blocking_lock("a3", timeout: 5) { :waited_for_nothing }).to eq(:waited_for_nothing)
        expect(locker.nonblocking_lock("other") { :never }.run?).to be(false)
      end
      report(slowest_failure: outcomes.values.map(&:last).max, back_in: back_in, then: took)
      expect([back_in, took]).to all(be < 2)
      expect(held_keys(admin, "#{prefix}*")).to eq([key_of("other")])
      expect_untouched(other)
      open, idle = locker.pool_state
      expect(idle).to eq(open)
    end

    it "after 3 s away, the Locker works again within about half a second of Redis's return" do
      locker = locker_on(server, pool_size: 2) # the default pool_timeout, 5 s
      locker.nonblocking_lock("warm") {}
      server.kill
      away_until = monotonic + 3
      while monotonic < away_until # callers meanwhile: each failure has the pool retry its connects
        expect { locker.nonblocking_lock("k") {} }.to raise_error(LockManager::ConnectionError)
        sleep 0.05
      end
      server.start
      back_in = elapsed { once_back(within: 5) { locker.nonblocking_lock("k") { :back } } }
      report(back_in: back_in)
      # The pool's background reconnects pause 0.5 s at most between tries, whatever pool_timeout is.
      expect(back_in).to be < 1.2
    end

    it "(b) during a block that raises: its exception comes out, and the failed release is logged" do
      log = capture_log
      locker = locker_on(server, connect_timeout: 0.5, pool_timeout: 1)
      error = Class.new(StandardError)
      %i[nonblocking_lock blocking_lock].each do |method|
        server.start unless server.running?
        expect do
          locker.public_send(method, "r", timeout: 30) do
            server.kill
            raise error, "the block's own"
          end
        end.to raise_error(error, "the block's own")
      end
      warnings = log.string.lines.grep(/"r"/)
      expect(warnings.size).to eq(2)
      expect(warnings).to all(include(address, "expires after its timeout"))
    end

    it "(b) during the block: the block's value stands, the release that cannot reach Redis is logged, not raised" do
      log = capture_log
      locker = locker_on(server, connect_timeout: 0.5, pool_timeout: 1)
      results = %i[nonblocking_lock blocking_lock].map do |method|
        server.start unless server.running?
        outcome_and_time do
          locker.public_send(method, "b", timeout: 30) do
            server.kill
            :the_work
          end
        end
      end

      nonblocking, blocking = results.map(&:first)
      expect([nonblocking.run?, nonblocking.result]).to eq([true, :the_work])
      expect(blocking).to eq(:the_work)
      report(took: results.map(&:last))
      expect(results.map(&:last)).to all(be < 1.5)
      warnings = log.string.lines.grep(/"b"/)
      expect(warnings.size).to eq(2)
      expect(warnings).to all(include(address, "expires after its timeout"))

      server.start # no persistence: nothing is left of the lock
      expect(held_keys(admin, "#{prefix}*")).to eq([])
      other = foreign_lock(server, "other")
      expect(once_back(within: 2) { locker.nonblocking_lock("b") { :back } }.result).to eq(:back)
      expect(locker.blocking_lock("b", timeout: 5) { :back }).to eq(:back)
      expect(held_keys(admin, "#{prefix}*")).to eq([key_of("other")])
      expect_untouched(other)
    end

    it "(b) during the block, restarted before it ends: the release finds another holder, reports lost, spares it" do
      log = capture_log
      locker = locker_on(server)
      %i[nonblocking_lock blocking_lock].each do |method|
        other = nil
        value, took = outcome_and_time do
          locker.public_send(method, "b-#{method}", timeout: 30) do |result|
            server.restart # empty: the lock is gone, and someone else takes the key
            other = foreign_lock(server, "b-#{method}")
            [:the_work, result] # blocking_lock returns the block's value: the Result, finished after the release
          end
        end

        work, result = method == :nonblocking_lock ? [value.result.first, value] : value
        expect([work, result.run?, result.lost?]).to eq([:the_work, true, true])
        report(method: method, took: took)
        expect(took).to be < 2
        expect_untouched(other)
        expect(other.owned?).to be(true)
      end
      expect(log.string.lines.grep(/lost/).size).to eq(2)
      expect(locker.nonblocking_lock("b2") { :back }.result).to eq(:back)
      expect(held_keys(admin, "#{prefix}*")).to eq([key_of("b-blocking_lock")]) # the other's, since the last restart
    end

    it "(c) before a release: Lock#release raises ConnectionError; restarted, the old handle spares the new holder" do
      locker = locker_on(server, connect_timeout: 0.5, pool_timeout: 1)
      lock = locker.try_lock("c", timeout: 5)
      server.kill

      calls = [-> { lock.release }, -> { lock.refresh(5) }, -> { lock.owned? }]
      outcomes = calls.map { |call| outcome_and_time(&call) }
      outcomes.each { |outcome| expect_connection_error(outcome, "c", within: 1.5) }

      server.start
      expect(admin.exists?(key_of("c"))).to be(false) # no persistence: no orphan lock
      other = foreign_lock(server, "c")
      took = elapsed do
        expect(once_back(within: 2) { lock.owned? }).to be(false)
        expect([lock.refresh(5), lock.release]).to eq([false, false])
        expect(locker.try_lock("c")).to be_nil # held by the other: not an error
        expect(locker.try_lock("c2", timeout: 5).release).to be(true)
      end
      report(release_refresh_owned: outcomes.map(&:last), after_restart: took)
      expect(took).to be < 2.5
      expect_untouched(other)
      expect(held_keys(admin, "#{prefix}*")).to eq([key_of("c")])
    end

    context "with --appendonly yes --appendfsync always" do
      let(:server) { start_server(appendonly: true) }

      it "a lock held across the kill and restart keeps its token and TTL, and expires on time" do
        locker = locker_on(server)
        other = foreign_lock(server, "other")

        # A block across the kill and restart: its lock was persisted, so the release finds it.
        result = locker.nonblocking_lock("b", timeout: 30) do
          server.restart
          admin.get(key_of("b"))
        end
        expect([result.run?, result.lost?]).to eq([true, false])
        expect(result.result).to match(SpecHelpers::TOKEN) # the token survived the restart
        expect(admin.exists?(key_of("b"))).to be(false)

        # A handle across the kill and restart: the lock is still there, then expires on its own.
        before_lock = monotonic
        lock = locker.try_lock("p", timeout: 2)
        server.restart
        expect(admin.get(key_of("p"))).to eq(lock.token)
        pttl = admin.pttl(key_of("p"))
        expect(pttl).to be_between(1, 2000)
        # Another Locker works, and sees it held (this thread still holds it through `locker`).
        second = locker_on(server)
        expect(second.try_lock("p")).to be_nil
        # A waiter takes it when it expires (woken by its TTL, not by a release).
        taken_after = second.blocking_lock("p", timeout: 10) { monotonic - before_lock }
        report(pttl_after_restart: pttl, taken_after: taken_after)
        expect(taken_after).to be_between(1.95, 3.0)
        expect(lock.release).to be(false)
        expect(held_keys(admin, "#{prefix}*")).to eq([key_of("other")])
        expect_untouched(other)
      end
    end
  end

  describe "Redis stops answering for longer than read_timeout during an acquire" do
    def stall(fault, pause_ms: 2000)
      if fault == "SIGSTOP"
        server.pause
      else
        admin.call("CLIENT", "PAUSE", pause_ms, "ALL")
      end
    end

    # Back to normal: SIGCONT, or the pause has run out (the admin client, paused too, answers).
    def unstall(fault)
      server.resume if fault == "SIGSTOP"
      admin.ping
    end

    # SET (acquires: the SET NX PX of the acquire pipeline) and EVAL (undos, written after a reply
    # that did not come) Redis ran so far.
    def acquires_and_undos
      %w[set eval].map { |name| command_calls(admin, name) }
    end

    # Connects, and runs a whole lock cycle: once a Locker has run a script, its acquires are the
    # scriptless SET NX + INCR pipeline, the hot path these faults must hit.
    def warm_up(locker)
      locker.nonblocking_lock("warm") {}
    end

    # A blocking_lock here waits less than read_timeout: its deadline passes during the stall (one
    # with time left rides the stall out: see "Waiters ride out").
    def acquire(locker, method, key)
      case method
      when :nonblocking_lock then locker.nonblocking_lock(key, timeout: 30) { :ran }
      when :try_lock then locker.try_lock(key, timeout: 30)
      else locker.blocking_lock(key, timeout: 0.2) { :ran }
      end
    end

    # The exit of any child process sends this process a SIGCHLD; Ruby's handlers do not restart
    # system calls, so a thread reading from Redis may see EINTR. The README promises that such
    # a call is retried instead of surfacing as a bogus error, and that an acquire cut short is
    # undone on its own connection.
    describe "a stray SIGCHLD arrives while the acquire waits for a reply" do
      def stray_sigchld_after(seconds)
        Thread.new do
          sleep seconds
          Process.kill(:CHLD, Process.pid) # what the exit of a child process sends
        end
      end

      %i[nonblocking_lock try_lock blocking_lock].each do |method|
        it "SIGSTOP, #{method}: still TimeoutError within about read_timeout, and no lock left", :aggregate_failures do
          locker = locker_on(server, pool_size: 1, read_timeout: 0.3, connect_timeout: 0.3)
          warm_up(locker)
          ours = pool_client_ids(admin)
          other = foreign_lock(server, "other")
          before = acquires_and_undos

          server.pause
          stray = stray_sigchld_after(0.1)
          error, took = outcome_and_time { acquire(locker, method, "k") }
          stray.join
          server.resume
          eventually { (pool_client_ids(admin) & ours).empty? }
          sleep 0.3 # Redis has run what the gem's connections had sent before they closed
          acquired, undone = acquires_and_undos.zip(before).map { |now, was| now - was }
          report(error: error.class, took: took, acquired: acquired, undone: undone, left_ms: admin.pttl(key_of("k")))

          expect(error).to be_a(LockManager::TimeoutError)
          expect(took).to be < 2.0
          expect(undone).to eq(acquired), "Redis ran #{acquired} acquire(s) and #{undone} undo(s)"
          expect(admin.exists?(key_of("k"))).to be(false), "a lock was left for #{admin.pttl(key_of("k"))} ms"
          expect_untouched(other)
        end
      end

      it "CLIENT PAUSE ALL, try_lock (5 times): TimeoutError, not a bogus \"Interrupted system call\"" do
        other = foreign_lock(server, "other")
        outcomes = Array.new(5) do |i|
          locker = locker_on(server, pool_size: 1, read_timeout: 0.3, connect_timeout: 0.3)
          warm_up(locker)
          admin.call("CLIENT", "PAUSE", 700, "ALL")
          stray = stray_sigchld_after(0.1)
          outcome = outcome_and_time { acquire(locker, :try_lock, "k#{i}") }
          stray.join
          admin.ping # the pause is over
          outcome
        end
        sleep 0.3
        errors, took = outcomes.transpose
        report(errors: errors.map { |e| "#{e.class}: #{e.message[/: ([^:]*)\z/, 1]}" }, took: took)

        aggregate_failures do
          expect(errors).to all(be_a(LockManager::TimeoutError))
          expect(errors.map(&:message).grep(/Interrupted system call/)).to eq([])
          expect(took).to all(be < 1.2)
          expect(held_keys(admin, "#{prefix}*")).to eq([key_of("other")])
          expect_untouched(other)
        end
      end
    end

    ["SIGSTOP", "CLIENT PAUSE ALL"].each do |fault|
      %i[nonblocking_lock try_lock blocking_lock].each do |method|
        it "#{fault}, #{method}: TimeoutError within about read_timeout, connection dropped, no lock left" do
          locker = locker_on(server, pool_size: 1, read_timeout: 0.3, connect_timeout: 0.3)
          warm_up(locker)
          ours = pool_client_ids(admin)
          other = foreign_lock(server, "other")
          expect(locker.pool_state).to eq([1, 1])
          before = acquires_and_undos

          stall(fault)
          outcome = outcome_and_time { acquire(locker, method, "k") }
          state = locker.pool_state
          unstall(fault)

          report(took: outcome.last)
          expect_connection_error(outcome, "k", within: 1.2)
          expect(outcome.first).to be_a(LockManager::TimeoutError)
          expect(outcome.first.message).to include("read_timeout")
          expect(outcome.last).to be > 0.25
          expect(state).to eq([0, 0]) # the timed-out connection was dropped, not pooled (pool_size 1)
          # Redis ran what that connection had sent (the acquire, then its undo: SIGSTOP), or dropped
          # it with the connection, closed meanwhile (CLIENT PAUSE).
          eventually { (pool_client_ids(admin) & ours).empty? }
          expect(admin.exists?(key_of("k"))).to be(false)
          acquired, undone = acquires_and_undos.zip(before).map { |now, was| now - was }
          expect(undone).to eq(acquired)
          expect(acquired).to eq(1) if fault == "SIGSTOP"
          sleep 0.2
          expect(held_keys(admin, "#{prefix}*")).to eq([key_of("other")])
          expect_untouched(other)
          expect(locker.nonblocking_lock("k") { :again }.result).to eq(:again)
          expect(locker.locked?("other")).to be(true) # each caller reads its own reply
          open, idle = locker.pool_state
          expect(idle).to eq(open)
        end
      end

      it "#{fault}, blocking_lock queued behind a holder, with time left: TimeoutError at its deadline if Redis " \
         "stays away, not LockNotAcquired; it leaves the queue" do
        locker = locker_on(server, pool_size: 1, read_timeout: 0.3, connect_timeout: 0.3, pool_timeout: 1)
        other = foreign_lock(server, "other")
        locker.locked?("w") # connected: a loaded machine's first connect must not eat the holder's time
        foreign_lock(server, "w", timeout: 2)
        waiter = Thread.new { outcome_and_time { locker.blocking_lock("w", timeout: 2.3) { :ran } } }
        # It waits in the queue (a waiter that ended already says why).
        eventually { admin.exists?(queue_key(key_of("w"))) || (!waiter.alive? && raise("waiter: #{waiter.value}")) }
        stall(fault, pause_ms: 3000) # the holder's lock expires meanwhile: the waiter tries again, gets no answer
        outcome = waiter.value
        state = locker.pool_state
        unstall(fault)

        expect_connection_error(outcome, "w", within: 4.3)
        expect(outcome.first).to be_a(LockManager::TimeoutError)
        expect(outcome.last).to be > 2.2 # it kept trying until its deadline
        # Nothing left checked out; the connections that timed out were dropped (a connection the pool
        # opened meanwhile may be there: Redis still accepts connections while paused).
        expect(state.last).to eq(state.first)
        expect(state.first).to be <= 1
        sleep 0.5 # Redis has run what the waiter's connections had sent, or dropped it with them
        # What it could not undo while Redis was away lapses with its 2 s heartbeat: a place in the
        # queue (whose keys live twice that), or a lock a late copy of its attempt took (granted
        # for the heartbeat at most): the next waiter is not held up for longer.
        expect(admin.pttl(key_of("w"))).to be <= 2000
        expect(held_keys(admin, "#{key_of("w")}*").map { |k| admin.pttl(k) }).to all(be_between(1, 4000))
        value = nil
        took = elapsed { value = once_back(within: 2) { locker.blocking_lock("w", timeout: 5) { :again } } }
        expect(value).to eq(:again)
        report(took: outcome.last, next_waiter_took: took)
        expect(took).to be < 3
        eventually(timeout: 5) { held_keys(admin, "#{key_of("w")}*").empty? }
        expect_untouched(other)
      end
    end
  end

  describe "CLIENT KILL of every pooled connection while a block runs" do
    %i[nonblocking_lock blocking_lock].each do |method|
      it "#{method}: the release after the block still works, and the pool refills and works" do
        log = capture_log
        locker = locker_on(server, pool_size: 3)
        other = foreign_lock(server, "other")
        before = pool_client_ids(admin)
        fill_pool(locker, 3)
        expect(locker.pool_state).to eq([3, 3])
        ours = pool_client_ids(admin) - before
        expect(ours.size).to eq(3)

        block_ended = nil
        result, took = outcome_and_time do
          locker.public_send(method, "k", timeout: 30) do |result|
            ours.each { |id| admin.call("CLIENT", "KILL", "ID", id) }
            block_ended = monotonic
            result # blocking_lock returns it: the Result it yielded, finished after the release
          end
        end
        released_in = monotonic - block_ended
        report(took: took, released_in: released_in)

        expect([result.run?, result.lost?]).to eq([true, false])
        expect(took).to be < 2
        expect(released_in).to be < 1
        expect(admin.exists?(key_of("k"))).to be(false)
        expect(log.string).to eq("")
        expect(pool_client_ids(admin) & ours).to eq([])
        fill_pool(locker, 3)
        expect(locker.pool_state).to eq([3, 3])
        expect(locker.nonblocking_lock("k") { :usable }.result).to eq(:usable)
        expect_untouched(other)
        expect(held_keys(admin, "#{prefix}*")).to eq([key_of("other")])
      end
    end
  end

  describe "lease renewal (renew: true) under faults" do
    it "Redis SIGSTOPped for longer than the lock's timeout: the lock is reported lost, the new holder spared" do
      log = capture_log
      locker = locker_on(server, read_timeout: 0.4, connect_timeout: 0.4)
      rival = locker_on(server, pool_size: 1)
      other = foreign_lock(server, "other")
      seen = {}
      outcome, took = outcome_and_time do
        locker.nonblocking_lock("k", timeout: 0.6, renew: true) do |result|
          sleep 0.1
          server.pause
          sleep 1.2 # twice the lock's timeout: no renewal can reach Redis
          server.resume
          seen[:lost_after_resume] = elapsed { eventually(timeout: 3) { result.lost? } }
          seen[:taken] = rival.try_lock("k", timeout: 30) # it expired: someone else takes it
          :the_work
        end
      end

      expect([outcome.run?, outcome.result, outcome.lost?]).to eq([true, :the_work, true])
      report(took: took, lost_after_resume: seen[:lost_after_resume])
      expect(seen[:lost_after_resume]).to be < 1 # the renewer knew before Redis came back
      expect(took).to be < 3.5
      expect(seen[:taken]).to be_a(LockManager::Lock)
      expect_untouched(seen[:taken], ttl: 30)
      expect_untouched(other)
      expect(log.string.lines.grep(/lost/).size).to eq(1)
    end

    it "Redis SIGSTOPped briefly (0.4 s, timeout 1.5 s): the renewal recovers and the lock is not lost" do
      log = capture_log
      locker = locker_on(server, read_timeout: 0.2, connect_timeout: 0.2)
      other = foreign_lock(server, "other")
      ttls = []
      outcome, took = outcome_and_time do
        locker.nonblocking_lock("k", timeout: 1.5, renew: true) do |result|
          sleep 0.35
          server.pause # across the first renewal, due at 0.5 s: it gets no answer, and is tried again
          sleep 0.4
          server.resume
          6.times do # until 2.55 s: long past the 1.5 s the lock had without renewal
            sleep 0.3
            ttls << admin.pttl(key_of("k"))
          end
          result.lost?
        end
      end

      expect([outcome.run?, outcome.result, outcome.lost?]).to eq([true, false, false])
      report(took: took, pttls: ttls)
      expect(ttls).to all(be > 0)
      expect(took).to be < 4
      expect(admin.exists?(key_of("k"))).to be(false)
      expect_untouched(other)
      expect(log.string).to eq("")
    end
  end

  describe "Thread#raise at random moments" do
    it "leaves no lock and no connection behind after 10,000 lock cycles from 8 threads" do
      chaos_error = Class.new(StandardError)
      locker = locker_on(server, pool_size: 4)
      other = foreign_lock(server, "held")
      tally = ChaosTally.new
      ready = Queue.new
      workers = Array.new(8) do |i|
        Thread.new do
          Thread.current.report_on_exception = false
          Thread.handle_interrupt(chaos_error => :never) do
            ready << i
            1250.times { |n| tally.cycle(chaos_error) { chaos_cycle(locker, i, n, tally, chaos_error) } }
          end
        rescue chaos_error
          nil # raised after its last cycle
        end
      end
      8.times { ready.pop }
      done = false
      chaos = Thread.new do
        until done
          workers.sample.raise(chaos_error, "chaos") rescue nil # rubocop:disable Style/RescueModifier
          sleep rand * 0.002
        end
      end
      took = elapsed { workers.each(&:join) }
      done = true
      chaos.join

      report(took: took, cycles: tally.cycles, ran: tally.ran, interrupted: tally.interrupted,
             longest: tally.longest, pool: locker.pool_state)
      expect(tally.cycles).to eq(10_000)
      expect(tally.unexpected).to eq([]) # no LockNotAcquired, ConnectionError, PoolTimeout...
      expect(tally.interrupted).to be > 50 # the chaos did reach the lock calls
      expect(tally.ran).to be > 1000
      expect([tally.overlaps, tally.ran_on_held]).to eq([0, 0]) # one holder at a time; the held key never ran
      expect(tally.longest).to be < 5 # no waiter sat out a leaked lock's 10 s
      expect(took).to be < 30
      expect(held_keys(admin, "#{prefix}*")).to eq([key_of("held")])
      expect_untouched(other)
      open, idle = locker.pool_state
      expect(idle).to eq(open)
      expect(open).to be <= 4
      eventually { pool_client_ids(admin).size == locker.pool_state.first + 1 } # + the other holder's
      expect(locker.nonblocking_lock("after") { :usable }.result).to eq(:usable)
    end

    def chaos_cycle(locker, thread, cycle, tally, chaos_error)
      key = %w[k0 k1 k2 held][(thread + cycle) % 4]
      Thread.handle_interrupt(chaos_error => :immediate) do
        if key == "held" || cycle.even?
          locker.nonblocking_lock(key, timeout: 10) { tally.hold(key, chaos_error) }
        else
          locker.blocking_lock(key, timeout: 10) { tally.hold(key, chaos_error) }
        end
      end
    end
  end
end
