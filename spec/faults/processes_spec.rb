# frozen_string_literal: true

require "spec_helper"
require_relative "../support/process_helpers"

# Processes that die holding a lock, are interrupted while they wait, fork while they lock, or
# outlive their lock while another process takes it. Each example checks that nothing was lost,
# that nothing waited past its bound (bounds are generous: the suite runs on a busy 2-core
# machine), and that no other holder's lock was touched.
RSpec.describe "Processes" do
  include ProcessHelpers

  after { stop_all }

  let(:locker) { new_locker }

  # What a `ruby -I lib -e` child starts with: a Locker on the suite's Redis, under this prefix.
  def prelude
    <<~RUBY
      $stdout.sync = true
      require "lock_manager"
      locker = LockManager::Locker.new(redis_url: ENV.fetch("LM_URL"), key_prefix: ENV.fetch("LM_PREFIX"), pool_size: 8)
    RUBY
  end

  def child_env
    { "LM_URL" => redis_url, "LM_PREFIX" => prefix }
  end

  def full(key)
    "#{prefix}#{key}"
  end

  # When `key` expires, as [earliest, latest] monotonic times, from its PTTL.
  def expiry_of(key)
    before = monotonic
    pttl = redis.pttl(full(key))
    after = monotonic
    raise "#{key} has no TTL (#{pttl})" unless pttl.positive?

    [before + (pttl / 1000.0), after + ((pttl + 1) / 1000.0)]
  end

  # Shows the measured times when LM_FAULTS_TIMES is set (they are asserted either way).
  def measured(**values)
    warn "  #{RSpec.current_example.description[0, 60]}: #{values}" if ENV["LM_FAULTS_TIMES"]
  end

  describe "a holder process SIGKILLed inside its block" do
    it "keeps the lock until its TTL (1 s) runs out, then lets the next holder in, never before" do
      mine = locker.try_lock("mine", timeout: 30)
      holder = ruby_child(<<~RUBY, child_env)
        #{prelude}
        locker.nonblocking_lock("polled", timeout: 1) do
          locker.nonblocking_lock("awaited", timeout: 1) do
            puts "holding"
            sleep
          end
        end
      RUBY
      expect(holder.gets).to eq("holding")
      polled_earliest, polled_latest = expiry_of("polled")
      awaited_earliest, awaited_latest = expiry_of("awaited")
      waiter = Thread.new { locker.blocking_lock("awaited", timeout: 5) { monotonic } }
      killed_at = monotonic
      holder.kill(:KILL)
      expect(holder.wait(timeout: 5).termsig).to eq(Signal.list["KILL"])

      attempts = [] # [started, finished, taken?]
      taken = nil
      until taken || monotonic > polled_latest + 2
        started = monotonic
        taken = locker.try_lock("polled", timeout: 30)
        attempts << [started, monotonic, !taken.nil?]
        sleep 0.02 unless taken
      end
      got_awaited_at = waiter.value

      refused = attempts.reject(&:last)
      expect(refused.size).to be >= 10 # refused all along the TTL...
      expect(taken).to be_a(LockManager::Lock) # ...then taken once it ran out,
      expect(attempts.last[1]).to be >= polled_earliest # not before (Redis answered after the expiry)
      expect(attempts.last[0]).to be < polled_latest + 0.3 # and not much after
      # A blocking waiter is not told (nobody released): it takes the lock when the TTL runs out.
      expect(got_awaited_at).to be_between(awaited_earliest, awaited_latest + 0.6)
      measured(ttl_left_at_kill: (polled_latest - killed_at).round(3), refused: refused.size,
               taken_after_expiry: (attempts.last[1] - polled_earliest).round(3),
               waiter_after_expiry: (got_awaited_at - awaited_earliest).round(3))

      expect(redis.get(full("mine"))).to eq(mine.token) # the other holder's lock is untouched
      expect(redis.pttl(full("mine"))).to be > 25_000
      expect([taken.release, mine.release]).to eq([true, true])
      expect(held_keys(redis, "#{prefix}*")).to eq([])
    end
  end

  describe "a signal to a process waiting in blocking_lock" do
    # Signals `child`, then checks that it exited from that signal within 1 s, leaving the test's
    # `locks` as they were (same token, TTL not reset) and nothing queued.
    def expect_clean_exit(child, signal, locks)
      status = nil
      took = elapsed do
        child.kill(signal)
        status = child.wait(timeout: 3)
      end
      measured(exit_after_signal: took.round(3))

      expect(status&.termsig).to eq(Signal.list[signal.to_s])
      expect(took).to be < 1.0
      # No queue, no waiter's details: only the test's locks.
      expect(held_keys(redis, "#{prefix}*").sort).to eq(locks.map { |lock| full(lock.key) }.sort)
      locks.each do |lock|
        expect(redis.get(full(lock.key))).to eq(lock.token)
        expect(redis.pttl(full(lock.key))).to be > 25_000
      end
      # Released now, the locks are free at once: handed to no ghost of a waiter.
      expect(locks.map(&:release)).to all(be(true))
      expect(held_keys(redis, "#{prefix}*")).to eq([])
      expect(locker.nonblocking_lock("held") { :free }.result).to eq(:free)
    end

    { INT: 'locker.blocking_lock("held", timeout: 30) { sleep }',
      TERM: 'locker.lock("held", timeout: 30, fair: true)' }.each do |signal, wait|
      it "SIG#{signal} to a process whose one thread waits (queued): it exits within 1 s, leaving nothing held " \
         "or queued, the holder's locks untouched" do
        held = locker.try_lock("held", timeout: 30)
        bystander = locker.try_lock("bystander", timeout: 30)
        waiter = ruby_child(<<~RUBY, child_env)
          #{prelude}
          puts "waiting"
          #{wait}
        RUBY
        expect(waiter.gets).to eq("waiting")
        eventually { redis.zcard(queue_key(full("held"))) == 1 && redis.hlen(waiters_key(full("held"))) == 1 }

        expect_clean_exit(waiter, signal, [held, bystander])
      end
    end

    it "SIGINT to a process whose main thread waits while 3 other threads wait too: it exits within 1 s, " \
       "leaving nothing held or queued" do
      held = locker.try_lock("held", timeout: 30)
      other = locker.try_lock("other", timeout: 30)
      waiters = ruby_child(<<~RUBY, child_env)
        #{prelude}
        Thread.new { locker.blocking_lock("held", timeout: 30, fair: true) { sleep } }
        Thread.new { locker.lock("held", timeout: 30) }
        Thread.new { locker.blocking_lock("other", timeout: 30) { sleep } }
        puts "waiting"
        locker.blocking_lock("held", timeout: 30) { sleep }
      RUBY
      expect(waiters.gets).to eq("waiting")
      # Every waiter of the process is queued: the main thread and two others on "held".
      eventually { redis.zcard(queue_key(full("held"))) == 3 && redis.zcard(queue_key(full("other"))) == 1 }
      expect(redis.hlen(waiters_key(full("held")))).to eq(3)

      expect_clean_exit(waiters, :INT, [held, other])
    end

    it "SIGINT once it got the lock and runs its block: the lock is released on the way out" do
      held = locker.try_lock("held", timeout: 30)
      waiter = ruby_child(<<~RUBY, child_env)
        #{prelude}
        puts "waiting"
        locker.blocking_lock("held", timeout: 30) do
          puts "inside"
          sleep
        end
      RUBY
      expect(waiter.gets).to eq("waiting")
      eventually { redis.zcard(queue_key(full("held"))) == 1 }
      expect(held.release).to be(true) # handed to the waiting process
      expect(waiter.gets).to eq("inside")
      waiter_token = redis.get(full("held"))
      expect(waiter_token).not_to be_nil
      expect(waiter_token).not_to eq(held.token)

      status = nil
      took = elapsed do
        waiter.kill(:INT)
        status = waiter.wait(timeout: 5)
      end
      measured(exit_after_signal: took.round(3))

      expect(status&.termsig).to eq(Signal.list["INT"])
      expect(took).to be < 1.0
      expect(held_keys(redis, "#{prefix}*")).to eq([])
    end
  end

  describe "fork while locking" do
    let(:server) { private_server } # every client it lists is this example's
    let(:admin) { server.client }
    let(:parent_locker) { LockManager::Locker.new(redis_url: server.url, key_prefix: "#{prefix}l:", pool_size: 3) }
    let(:shared_keys) { %w[s0 s1 s2] }

    after { admin.close }

    # One nonblocking_lock cycle on `key`; the block counts itself in Redis (with a plain client of
    # the calling process) and flags any other block of the same key running at the same time.
    def cycle(locker, key, client)
      locker.nonblocking_lock(key, timeout: 10) do
        inside = "#{prefix}inside:#{key}"
        client.incr("#{prefix}overlaps") unless client.set(inside, "1", nx: true)
        client.incr("#{prefix}runs:#{key}")
        client.del(inside)
      end.run?
    end

    # `count` cycles, even ones on `own` keys, odd ones on the shared keys.
    # @return [Hash] runs and skips per key, and the errors met
    def cycles(locker, count, own, client)
      tally = { "runs" => Hash.new(0), "skips" => Hash.new(0), "errors" => [] }
      count.times do |i|
        key = i.even? ? own[i / 2 % own.size] : shared_keys[i % shared_keys.size]
        tally[cycle(locker, key, client) ? "runs" : "skips"][key] += 1
      rescue StandardError => e
        tally["errors"] << "#{e.class}: #{e.message}"
      end
      tally
    end

    # The logical lock key each watched command named ("c0", "renewed", ...), by client address.
    def keys_by_client(commands)
      pattern = /"#{Regexp.escape(prefix)}l:([^":]+)/
      commands.each_with_object(Hash.new { |h, k| h[k] = [] }) do |(client, line), seen|
        next if client == "lua"

        line.scan(pattern) { |(key)| seen[client] << key unless key == "lock_manager" }
      end
    end

    it "child (1,000 locks) and parent (2 threads on the same Locker) lock side by side: " \
       "exact counts, no overlap, no error, nothing left, the parent's pool and renewed lock intact" do
      warm = Array.new(3) { |t| Thread.new { 30.times { |i| parent_locker.nonblocking_lock("warm#{t}#{i}") {} } } }
      warm.each(&:join)
      renewed = parent_locker.try_lock("renewed", timeout: 0.6, renew: true)
      parent_clients = client_addresses(admin)
      expect(parent_clients.size).to be_between(1, 3)
      monitor = ProcessHelpers::Monitor.new(server.port)
      url = server.url

      child = fork_child do |parent|
        client = Redis.new(url: url)
        own_renewed = parent_locker.try_lock("child-renewed", timeout: 0.3, renew: true) # the child's renewer
        taken_at = Process.clock_gettime(Process::CLOCK_MONOTONIC)
        tally = cycles(parent_locker, 1_000, %w[c0 c1], client)
        sleep [0.9 - (Process.clock_gettime(Process::CLOCK_MONOTONIC) - taken_at), 0].max
        tally["own_renewed"] = [own_renewed.owned?, own_renewed.lost?, own_renewed.release]
        tally["pool"] = parent_locker.pool_state
        parent.puts(JSON.generate(tally))
      end

      clients = Array.new(2) { Redis.new(url: url) }
      threads = Array.new(2) { |t| Thread.new { cycles(parent_locker, 500, ["p#{t}"], clients[t]) } }
      renewed_ttls = []
      deadline = monotonic + 40
      until threads.none?(&:alive?) && child.wait(timeout: 0)
        raise "the child or the parent's threads did not finish within 40 s" if monotonic > deadline

        renewed_ttls << admin.pttl("#{prefix}l:renewed")
        sleep 0.05
      end
      parent_tallies = threads.map(&:value)
      child_tally = JSON.parse(child.gets)
      expect(child.wait.success?).to be(true)
      sleep 0.3 # a renewal more, after the child is gone
      renewed_ttls << admin.pttl("#{prefix}l:renewed")
      commands = monitor.stop
      measured(renewed_ttl_samples: renewed_ttls.size, min_ttl: renewed_ttls.min, commands: commands.size)

      # Neither side saw an error; every block ran alone; every count is exact.
      expect(child_tally["errors"] + parent_tallies.flat_map { |t| t["errors"] }).to eq([])
      expect(admin.get("#{prefix}overlaps")).to be_nil
      all = [child_tally, *parent_tallies]
      count = ->(kind, key) { all.sum { |t| t[kind].fetch(key, 0) } }
      %w[c0 c1 p0 p1].each do |key| # own keys: every cycle ran
        expect([count.call("runs", key), count.call("skips", key)]).to eq([250, 0])
        expect(admin.get("#{prefix}runs:#{key}").to_i).to eq(250)
      end
      shared_keys.each_with_index do |key, k| # shared keys: each cycle ran or was skipped, and Redis agrees
        attempts = [1_000, 500, 500].sum { |n| (0...n).count { |i| i.odd? && i % 3 == k } }
        expect(count.call("runs", key) + count.call("skips", key)).to eq(attempts)
        expect(admin.get("#{prefix}runs:#{key}").to_i).to eq(count.call("runs", key))
        expect(count.call("runs", key)).to be_positive
      end

      # The child's renewer renewed the child's lock; the parent's renewed lock lived on, renewed by
      # the parent only: no connection of the child ever named it, nor any key of the parent.
      expect(child_tally["own_renewed"]).to eq([true, false, true])
      expect(renewed_ttls).to all(be > 0)
      expect([renewed.owned?, renewed.lost?]).to eq([true, false])
      by_client = keys_by_client(commands)
      child_side = by_client.select { |_, keys| keys.intersect?(%w[c0 c1 child-renewed]) }.keys
      parent_side = by_client.select { |_, keys| keys.intersect?(%w[p0 p1 renewed]) }.keys
      expect(child_side).not_to be_empty
      expect(child_side & parent_side).to eq([])
      expect(child_side & parent_clients).to eq([]) # the child never used the parent's sockets
      expect(by_client.values_at(*child_side).flatten & %w[p0 p1 renewed]).to eq([])
      expect(commands.count { |c, line| parent_side.include?(c) && line.include?(renewed.token) }).to be >= 5

      # The parent's pool: its connections survived the child, all of them idle once the renewal
      # stopped (none leaked), and it still locks.
      expect(client_addresses(admin)).to include(*parent_clients)
      expect(child_tally["pool"].first).to be_between(1, 3)
      expect(renewed.release).to be(true)
      open, idle = eventually(timeout: 2) { parent_locker.pool_state.then { |o, i| [o, i] if o == i } }
      expect(open).to be_between(1, 3)
      expect(idle).to eq(open)
      expect(parent_locker.nonblocking_lock("after") { :parent }.result).to eq(:parent)
      expect(held_keys(admin, "#{prefix}l:*")).to eq([])
    ensure
      clients&.each(&:close)
    end

    # The pool's connector threads park and wake (parking_lot) right after a Locker's first lock.
    # Forked at that moment, a child used to inherit a parked-thread table locked by a thread it
    # does not have, and hung in its first lock (about 1 fork in 300 here, before the patch).
    it "2,000 children forked right after their parent's first lock each lock at once: none hangs" do
      forks = 2_000
      runner = ruby_child(<<~RUBY, child_env.merge("LM_URL" => server.url, "LM_FORKS" => forks.to_s))
        #{prelude}
        hung = failed = 0
        Integer(ENV.fetch("LM_FORKS")).times do |i|
          fresh = LockManager::Locker.new(redis_url: ENV.fetch("LM_URL"), key_prefix: ENV.fetch("LM_PREFIX"))
          fresh.nonblocking_lock("parent:\#{i % 4}") {}
          pid = fork { exit!(fresh.nonblocking_lock("child:\#{i % 4}") { :ran }.result == :ran ? 0 : 3) }
          deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 5
          status = nil
          until (status = Process.wait2(pid, Process::WNOHANG)&.last)
            break if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline

            sleep 0.001
          end
          next failed += 1 if status && !status.success?
          next if status

          hung += 1
          Process.kill(:KILL, pid)
          Process.wait(pid)
        end
        puts "hung \#{hung} failed \#{failed}"
      RUBY

      expect(runner.gets(timeout: 240)).to eq("hung 0 failed 0")
      expect(runner.wait(timeout: 10)&.success?).to be(true), runner.stderr
      expect(held_keys(admin, "#{prefix}*")).to eq([])
    end
  end

  describe "a lock that expires while its block runs, taken meanwhile by another process" do
    # Another process: on "go" it tries `key` every 10 ms until it gets it (timeout 30 s), and says
    # "took <token> <when> <refusals>"; then answers "check" with whether it still owns its lock,
    # and "release" with what its release returned.
    def other_process(key)
      url = redis_url
      key_prefix = prefix
      fork_child do |parent|
        other = LockManager::Locker.new(redis_url: url, key_prefix: key_prefix)
        parent.puts "ready"
        parent.gets
        refusals = 0
        until (lock = other.try_lock(key, timeout: 30))
          refusals += 1
          sleep 0.01
        end
        parent.puts "took #{lock.token} #{Process.clock_gettime(Process::CLOCK_MONOTONIC)} #{refusals}"
        parent.gets
        parent.puts "owned #{lock.owned?}"
        parent.gets
        parent.puts "released #{lock.release}"
      end
    end

    # Runs `lock_call` (timeout 0.3 s) whose block lets `other` take the key once it expired, and
    # sleeps until it has run 0.6 s. @return [Array] what lock_call returned or raised, and
    # [other's token, how long after the first holder's start it got the key, its refusals]
    def outlive(other, &lock_call)
      expect(other.gets).to eq("ready")
      taken = nil
      outcome = begin
        lock_call.call do
          started = monotonic
          other.puts "go"
          _, token, at, refusals = other.gets.split
          taken = [token, Float(at) - started, Integer(refusals)]
          sleep [0.6 - (monotonic - started), 0].max
          :first_value
        end
      rescue LockManager::LockLost => e
        e
      end
      [outcome, taken]
    end

    def expect_other_intact(other, key, token)
      expect(redis.get(full(key))).to eq(token)
      expect(redis.pttl(full(key))).to be > 25_000
      other.puts "check"
      expect(other.gets).to eq("owned true")
      other.puts "release"
      expect(other.gets).to eq("released true")
      expect(other.wait.success?).to be(true)
    end

    it "is reported by Result#lost? (and one log line), and the release leaves the other process's lock alone" do
      log = StringIO.new
      LockManager.configure { |c| c.logger = Logger.new(log) }
      other = other_process("k")
      result, (token, after, refusals) = outlive(other) { |&block| locker.nonblocking_lock("k", timeout: 0.3, &block) }
      measured(other_took_it_after: after.round(3), refusals: refusals)

      expect([result.run?, result.lost?, result.result]).to eq([true, true, :first_value])
      expect(after).to be_between(0.25, 0.6) # the other process got it when the TTL ran out, not before
      expect(refusals).to be >= 5
      expect(log.string.lines.grep(/lost/).size).to eq(1)
      expect(log.string).to include('"k"', "0.3s")
      expect(locker.nonblocking_lock("other-key") {}.lost?).to be(false)
      expect_other_intact(other, "k", token)
      expect(held_keys(redis, "#{prefix}*")).to eq([])
    end

    it "raises LockLost with on_lost: :raise (nonblocking_lock and blocking_lock), the other's lock intact" do
      strict = new_locker(on_lost: :raise)
      calls = {
        "nb" => ->(&block) { strict.nonblocking_lock("nb", timeout: 0.3, &block) },
        "bl" => ->(&block) { strict.blocking_lock("bl", timeout: 0.3, &block) }
      }
      calls.each do |key, call|
        other = other_process(key)
        error, (token, after) = outlive(other, &call)

        expect(error).to be_a(LockManager::LockLost)
        expect([error.key, error.value]).to eq([key, :first_value])
        expect(error.ran_for).to be_between(0.55, 1.5)
        expect(after).to be_between(0.25, 0.6)
        expect_other_intact(other, key, token)
      end
      expect(held_keys(redis, "#{prefix}*")).to eq([])
    end

    it "leaves a Lock handle that expired unable to touch the other process's lock (owned?, refresh, release)" do
      other = other_process("k")
      expect(other.gets).to eq("ready")
      lock = locker.try_lock("k", timeout: 0.3)
      taken_at = monotonic
      other.puts "go"
      _, token, at, refusals = other.gets.split
      measured(other_took_it_after: (Float(at) - taken_at).round(3), refusals: refusals)

      expect(Float(at) - taken_at).to be_between(0.25, 0.6)
      expect(Integer(refusals)).to be >= 5
      expect([lock.owned?, lock.refresh(1), lock.release]).to eq([false, false, false])
      expect_other_intact(other, "k", token)
      expect(held_keys(redis, "#{prefix}*")).to eq([])
    end
  end
end
