# frozen_string_literal: true

require "spec_helper"
require_relative "../support/topologies"
require_relative "../support/process_helpers"

# Failovers under the gem, each on a fresh RedisSentinelSet: the primary SIGKILLed while waiters
# wait (they take the lock from the new primary), the old primary back as a replica (never written
# to), and a manual SENTINEL FAILOVER while locks are taken (the old primary stays alive). Bounds
# are generous: the suite runs on a busy 2-core machine. LM_FAULTS_TIMES=1 prints what was measured.
RSpec.describe "Sentinel failovers", :topology do
  let(:fresh) { own_server(RedisSentinelSet) }

  def sentinel_locker(**options)
    LockManager::Locker.new(sentinels: fresh.sentinel_urls, sentinel_master: fresh.name,
                            redis_url: fresh.master_url, key_prefix: prefix, **options)
  end

  def full(key)
    "#{prefix}#{key}"
  end

  # Commands that write, as MONITOR names them; none may reach a replica from the gem. (Not PUBLISH:
  # the sentinels publish their hellos on every node.)
  def write_commands
    %w[SET GETSET DEL UNLINK INCR PEXPIRE PEXPIREAT EXPIRE ZADD ZREM ZREMRANGEBYSCORE HSET HDEL
       EVAL EVALSHA EVAL_RO EVALSHA_RO FCALL FCALL_RO MULTI EXEC]
  end

  def measured(**values)
    warn "  #{RSpec.current_example.description[0, 60]}: #{values}" if ENV["LM_FAULTS_TIMES"]
  end

  # What a replica refused of the write commands: rejected and failed calls per command, and how
  # often it answered READONLY. (Not its calls: it runs the writes its primary streams to it.)
  def refused_writes(client)
    stats = client.info("commandstats").slice(*write_commands.map(&:downcase))
    [stats.transform_values { |s| s.values_at("rejected_calls", "failed_calls").map(&:to_i) }.reject do |_, counts|
      counts.sum.zero?
    end, client.info("errorstats")["errorstat_READONLY"]]
  end

  # Write commands a MONITOR saw from any client but the replication link (from `master_port`).
  def writes_seen(commands, master_port)
    commands.reject { |addr, _| addr.end_with?(":#{master_port}") }.select do |_, line|
      write_commands.include?(line.split.first.to_s.delete('"').upcase)
    end
  end

  # Nonblocking calls on fresh keys until one runs; when it did (monotonic), or nil after `within`.
  def first_success(locker, label, within:)
    deadline = monotonic + within
    n = 0
    while monotonic < deadline
      begin
        return monotonic if locker.nonblocking_lock("#{label}:#{n += 1}") { :ran }.run?
      rescue LockManager::ConnectionError
        sleep 0.02
      end
    end
    nil
  end

  # How long a waiter of `locker` takes to wake after the holder (another Locker) releases.
  def wake_delay(locker, holder_locker, key)
    holder = holder_locker.try_lock(key, timeout: 30)
    woke = Thread.new { locker.blocking_lock(key, timeout: 10) { monotonic } }
    sleep 0.3 # well into its wait
    released_at = monotonic
    expect(holder.release).to be(true)
    woke.value - released_at
  end

  describe "the primary SIGKILLed" do
    it "while waiters wait for a held lock: they take it from the new primary, and new calls succeed within 1 s " \
       "of the sentinels naming it", timeout: 90 do
      old = fresh.primary
      survivor = fresh.replica
      locker = sentinel_locker(pool_size: 8)
      listener = sentinel_locker(retry_interval: 5) # a waiter of its own polls every 5 s at most
      expect(wake_delay(listener, sentinel_locker, "before")).to be < 0.3 # subscribed on the old primary
      holder = sentinel_locker.try_lock("job", timeout: 2) # lost with the primary, or expired by then
      survivor_clients = Array.new(3) { client_of(survivor) }
      log = Queue.new
      waiters = Array.new(3) do |i|
        Thread.new do
          locker.blocking_lock("job", timeout: 15) do |lock|
            started = monotonic
            on_new_primary = survivor_clients[i].get(full("job"))
            sleep 0.1
            log << [i, started, monotonic, lock.fencing_token, on_new_primary]
          end
        end
      end
      eventually { client_of(old).zcard(queue_key(full("job"))) == 3 }

      killed_at = monotonic
      expect(fresh.kill_primary).to eq(old)
      expect(fresh.wait_for_failover(timeout: 30)).to eq(survivor)
      named_at = monotonic
      late = sentinel_locker # built after the failover: its first connection goes to the new primary
      succeeded = { pooled: Thread.new { first_success(locker, "pooled", within: 5) },
                    new: Thread.new { first_success(late, "new", within: 5) } }.transform_values(&:value)
      waiters.each { |waiter| expect(waiter.join(20)).to be_a(Thread) }
      runs = Array.new(log.size) { log.pop }.sort_by { |run| run[1] }
      after_named = ->(at) { at && (at - named_at).round(3) }
      measured(failover: (named_at - killed_at).round(3), first_waiter: after_named.call(runs.first&.at(1)),
               pooled: after_named.call(succeeded[:pooled]), new: after_named.call(succeeded[:new]))

      expect(runs.size).to eq(3)
      expect(runs.first[1]).to be_between(killed_at, named_at + 3.0)
      runs.each_cons(2) { |first, second| expect(second[1]).to be >= first[2] } # one at a time
      expect(runs.map(&:last)).to all(match(SpecHelpers::TOKEN)) # each waiter's token, on the new primary
      tokens = runs.map { |run| run[3] }
      expect(tokens).to eq(tokens.sort)
      expect(tokens.first).to be > holder.fencing_token
      succeeded.each_value { |at| expect(at).to be_between(killed_at, named_at + 3.0) }
      expect(wake_delay(listener, sentinel_locker, "after")).to be < 0.5 # subscribed on the new one
      expect(holder.release).to be(false) # lost with the primary: nothing of another's is deleted
      expect(held_keys(client_of(survivor), "#{prefix}*")).to eq([])
    end

    it "and restarted: it comes back as a replica that the gem never writes to", timeout: 120 do
      old = fresh.primary
      old_url = old.url # redis_url may even name it: only the sentinels choose where locks go
      earlier = LockManager::Locker.new(sentinels: fresh.sentinel_urls, sentinel_master: fresh.name,
                                        redis_url: old_url, key_prefix: prefix, pool_size: 4)
      Array.new(4) { |i| Thread.new { earlier.nonblocking_lock("warm:#{i}") { sleep 0.1 } } }.each(&:join)
      expect(earlier.pool_state.first).to be >= 2 # pooled connections to the old primary

      fresh.kill_primary
      survivor = fresh.wait_for_failover(timeout: 30)
      expect(first_success(earlier, "failed-over", within: 5)).not_to be_nil
      restarted_at = monotonic
      fresh.restart_old_primary
      expect(fresh.wait_until_replica(old, timeout: 45)).to eq(old)
      measured(replica_after: (monotonic - restarted_at).round(3))
      old_client = client_of(old)
      expect(old_client.call("ROLE").first(3)).to eq(["slave", "127.0.0.1", survivor.port])

      stats_before = refused_writes(old_client)
      survivor_writes = client_of(survivor).info("commandstats").dig("evalsha", "calls").to_i
      monitor = ProcessHelpers::Monitor.new(old.port)
      later = LockManager::Locker.new(sentinels: fresh.sentinel_urls, sentinel_master: fresh.name,
                                      redis_url: old_url, key_prefix: prefix)
      ran = [earlier, later].flat_map do |locker|
        Array.new(10) do |i|
          [locker.nonblocking_lock("burst:#{i}") { :ran }.result,
           locker.blocking_lock("burst", timeout: 5) { :waited },
           locker.try_lock("handle:#{i}").release]
        end
      end
      commands = monitor.stop

      expect(ran.uniq).to eq([[:ran, :waited, true]])
      expect(client_of(survivor).info("commandstats").dig("evalsha", "calls").to_i).to be > survivor_writes
      expect(writes_seen(commands, survivor.port)).to eq([])
      expect(refused_writes(old_client)).to eq(stats_before) # nothing run, nothing refused (READONLY)
      expect(held_keys(client_of(survivor), "#{prefix}*")).to eq([])
    end
  end

  describe "a manual SENTINEL FAILOVER (the old primary stays up and becomes a replica)" do
    it "keeps locks working: blocking calls succeed, nonblocking ones fail only during the failover, briefly",
       timeout: 90 do
      old = fresh.primary
      survivor = fresh.replica
      locker = sentinel_locker(pool_size: 8)
      listener = sentinel_locker(retry_interval: 5)
      expect(wake_delay(listener, sentinel_locker, "before")).to be < 0.3
      running = true
      nonblocking = [] # [started, finished, outcome, key]
      blocking = []
      started_at = monotonic
      threads = [Thread.new do
        n = 0
        while running
          began = monotonic
          key = "nb:#{n += 1}"
          outcome = begin
            locker.nonblocking_lock(key) { :ran }.run? ? :ran : :held
          rescue LockManager::Error => e
            e
          end
          nonblocking << [began, monotonic, outcome, key]
          sleep 0.02
        end
      end]
      threads += Array.new(3) do
        Thread.new do
          while running
            began = monotonic
            outcome = begin
              # A release that reaches the old primary after the promotion is lost: the lock it
              # held lives on, on the new primary, for its timeout, as any lock would (a handed-over
              # one too). The waits outlast that.
              locker.blocking_lock("shared", timeout: 3, wait: 15) do
                sleep 0.05
                :ran
              end
            rescue LockManager::Error => e
              e
            end
            blocking << [began, monotonic, outcome]
          end
        end
      end
      sleep 1

      issued_at = monotonic
      expect(client_of(fresh.sentinels.first).call("SENTINEL", "FAILOVER", fresh.name)).to eq("OK")
      expect(fresh.wait_for_failover(old, timeout: 30)).to eq(survivor)
      named_at = monotonic
      fresh.wait_until_replica(old, timeout: 45)
      replica_at = monotonic
      sleep 1 # locks after the failover too
      running = false
      threads.each(&:join)

      failures = nonblocking.reject { |_, _, outcome, _| outcome == :ran }
      window = failures.empty? ? 0 : failures.map { |run| run[1] }.max - failures.map(&:first).min
      measured(named: (named_at - issued_at).round(3), replica: (replica_at - issued_at).round(3),
               nonblocking: nonblocking.size, failed: failures.size, window: window.round(3),
               blocking: blocking.size, longest_blocking: blocking.map { |b, f, _| f - b }.max.round(3))

      expect(blocking.size).to be >= 10
      expect(blocking.map(&:last).uniq).to eq([:ran])
      expect(nonblocking.size).to be >= 50
      expect(failures.map(&:last)).to all(be_a(LockManager::ReadOnlyError))
      expect(window).to be < 3.0
      failures.each { |began, finished, _, _| expect([began, finished]).to all(be_between(issued_at, replica_at + 1)) }
      expect(nonblocking.select { |began, _, _, _| began > replica_at }.map { |run| run[2] }.uniq).to eq([:ran])
      expect(nonblocking.select { |began, _, _, _| began.between?(started_at, issued_at) }.map { |run| run[2] }.uniq)
        .to eq([:ran])

      expect(wake_delay(listener, sentinel_locker, "after")).to be < 0.5 # subscribed on the new primary
      old_client = client_of(old)
      stats_before = refused_writes(old_client)
      10.times { |i| locker.nonblocking_lock("after:#{i}") {} && locker.blocking_lock("after", timeout: 5) {} }
      expect(refused_writes(old_client)).to eq(stats_before) # the old primary, a replica now, is not written
      # A lock taken on the old primary whose release reached it once it was a replica lives on, on
      # the new primary, for its timeout, as the blocking ones' do (the failed release is logged):
      # only a call made during the failover may leave its key.
      during = nonblocking.select { |began, _, _, _| began.between?(issued_at, replica_at + 1) }
      expect(held_keys(client_of(survivor), "#{prefix}*") - during.map { |run| "#{prefix}#{run[3]}" }).to eq([])
    end
  end
end
