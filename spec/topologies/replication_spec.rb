# frozen_string_literal: true

require "spec_helper"
require_relative "../support/topologies"
require "lock_manager/admin"

# What the threads of a limiter example (below) were told, counted as they ran: :admitted, :refused,
# or the error's class.
class LimiterTally
  def initialize
    @mutex = Mutex.new
    @counts = Hash.new(0)
  end

  def <<(outcome)
    @mutex.synchronize { @counts[outcome] += 1 }
  end

  def [](outcome)
    @mutex.synchronize { @counts[outcome] }
  end

  def to_h
    @mutex.synchronize { @counts.transform_keys(&:to_s).sort.to_h }
  end
end

# min_replicas: an acquisition counts only once that many replicas acknowledged it (WAIT on the
# same connection); otherwise it is released again and NotReplicated raised. On the suite's shared
# RedisSentinelSet where nothing is killed (its replica is only paused, and resumed), on fresh sets
# where the primary is killed or failed over, and on the suite's standalone Redis.
RSpec.describe "min_replicas", :topology do
  let(:set) { RedisSentinelSet.shared }

  def locker_of(topology, **options)
    LockManager::Locker.new(sentinels: topology.sentinel_urls, sentinel_master: topology.name,
                            redis_url: topology.master_url, key_prefix: prefix, **options)
  end

  def replicated_locker(topology = set, **options)
    locker_of(topology, min_replicas: 1, **options)
  end

  def full(key)
    "#{prefix}#{key}"
  end

  def wait_calls(client)
    client.info("commandstats").dig("wait", "calls").to_i
  end

  def measured(**values)
    warn "  #{RSpec.current_example.description[0, 60]}: #{values}" if ENV["LM_FAULTS_TIMES"]
  end

  # Until the replica acknowledges a write of the primary: one that has just synced acknowledges
  # nothing before its first REPLCONF ACK, up to a second later.
  def await_acknowledgements(topology)
    client = client_of(topology.primary)
    eventually(timeout: 15, interval: 0.05) { client.incr(full("probe")) && client.wait(1, 100) == 1 }
    client.del(full("probe"))
  end

  # Pauses the shared set's replica (SIGSTOP) while the block runs.
  def with_replica_paused
    replica = set.replica
    set.pause(replica)
    yield replica
  ensure
    set.resume(replica)
  end

  describe "on a primary with a replica that answers" do
    it "grants after the replica acknowledged: the lock is on the replica before the block runs" do
      await_acknowledgements(set)
      locker = replicated_locker
      primary = client_of(set.primary)
      replica = client_of(set.replica)
      waits = wait_calls(primary)

      on_both = ->(key) { [primary.get(full(key)), replica.get(full(key))] }
      in_block = locker.nonblocking_lock("report", timeout: 30) { on_both.call("report") }.result
      waited = locker.blocking_lock("waited", timeout: 5) { on_both.call("waited") }
      lock = locker.try_lock("handle", timeout: 30)
      shared = locker.nonblocking_lock("partner-api", limit: 2) { |result| [result.fencing_token, result.lost?] }

      [in_block, waited].each { |on_primary, on_replica| expect(on_replica).to eq(on_primary).and(be_a(String)) }
      expect(replica.get(full("handle"))).to eq(lock.token)
      expect([shared.run?, shared.result]).to match([true, [be > 0, false]])
      expect(wait_calls(primary) - waits).to be >= 4 # one WAIT per grant
      expect(lock.release).to be(true)
      expect(held_keys(primary, "#{prefix}*")).to eq([])
      exports = LockManager::Limiter.window("exports", 2, per: 3600, locker: locker)
      expect(exports.try_acquire).to be_admitted
      expect(replica.keys("lock_manager:*:limit:window:#{prefix}exports").size).to eq(1) # before it said so
    end

    it "hands a released lock to a waiter only once its own attempt is acknowledged (replica paused at the " \
       "release)" do
      await_acknowledgements(set)
      locker = replicated_locker
      primary = client_of(set.primary)
      holder = locker_of(set).try_lock("k", timeout: 30) # another Locker, without min_replicas
      waiter = Thread.new { locker.blocking_lock("k", timeout: 10) { monotonic } }
      eventually { primary.zcard(queue_key(full("k"))) == 1 }

      resumed_at = nil
      with_replica_paused do
        expect(holder.release).to be(true) # handed to the waiter, which must confirm it
        sleep 1
        expect(waiter).to be_alive
        resumed_at = monotonic
      end
      got_at = waiter.value

      measured(after_resume: (got_at - resumed_at).round(3))
      expect(got_at - resumed_at).to be_between(0, 1.0)
      expect(held_keys(primary, "#{prefix}*")).to eq([])
    end

    it "extends a lock handed to a waiter to the waiter's timeout, acknowledged, before its block runs" do
      await_acknowledgements(set)
      locker = replicated_locker
      primary = client_of(set.primary)
      replica = client_of(set.replica)
      holder = locker_of(set).try_lock("k", timeout: 30)
      waiter = Thread.new { locker.blocking_lock("k", timeout: 10) { replica.pttl(full("k")) } }
      eventually { primary.zcard(queue_key(full("k"))) == 1 }
      expect(holder.release).to be(true) # handed to the waiter: 2 s, until it extends it

      expect(waiter.value).to be_within(1_000).of(10_000)
      expect(held_keys(primary, "#{prefix}*")).to eq([])
    end
  end

  describe "with the replica paused (SIGSTOP)" do
    it "nonblocking_lock and try_lock raise NotReplicated within about replica_timeout, and leave no lock " \
       "behind" do
      await_acknowledgements(set)
      locker = replicated_locker
      primary = client_of(set.primary)
      errors = with_replica_paused do
        [timed_error(LockManager::NotReplicated) { locker.nonblocking_lock("report") { raise "must not run" } },
         timed_error(LockManager::NotReplicated) { locker.try_lock("handle") },
         timed_error(LockManager::NotReplicated) { locker.nonblocking_lock("pool", limit: 2) { raise "must not run" } }]
      end

      measured(took: errors.map { |_, took| took.round(3) })
      errors.each do |error, took|
        expect(took).to be < 0.05 + 0.5
        expect(error).to be_a(LockManager::Error)
        expect(error.message).to include("0 of the 1 replicas", "min_replicas")
      end
      expect(errors.map { |error, _| error.message[/\Alock "[^"]+"/] })
        .to eq(['lock "report"', 'lock "handle"', 'lock "pool"'])
      expect(primary.keys("#{prefix}*")).to eq([])
      expect(held_keys(primary, "#{prefix}*")).to eq([]) # only the fencing counters live on
      free = locker_of(set)
      expect(free.try_lock("report")&.release).to be(true) # released again: free for others
      expect(free.nonblocking_lock("pool", limit: 1) { :free }.result).to eq(:free)
    end

    it "a limiter's admitted decision raises NotReplicated and is given back, so a failover cannot forget it" do
      await_acknowledgements(set)
      limiter = LockManager::Limiter.window("exports", 3, per: 3600, locker: replicated_locker)
      error, took = with_replica_paused { timed_error(LockManager::NotReplicated) { limiter.try_acquire } }

      expect(took).to be < 0.05 + 0.5
      expect(error.message).to include('limiter "exports"', "0 of the 1 replicas")
      await_acknowledgements(set)
      expect(limiter.try_acquire).to have_attributes(admitted?: true, remaining: 2) # the refused one gave its unit back
    end

    it "parks a job only once the replica acknowledged it: otherwise NotReplicated, and it is out of the line" do
      await_acknowledgements(set)
      locker = replicated_locker
      holder = locker.adopt("account", "jid-holder", timeout: 30)
      park = lambda do |jid|
        locker.park("account", jid, ttl: 5, grace: 1, most: nil, schedule: "#{prefix}schedule", fallback: "{}",
                                    push: [["LPUSH", "#{prefix}queue", jid]])
      end
      expect(Thread.new { park.call("jid-1") }.value).to eq([:parked, 1])
      error, took = with_replica_paused do
        parking = Thread.new { park.call("jid-2") }
        parking.report_on_exception = false
        timed_error(LockManager::NotReplicated) { parking.value }
      end

      expect(took).to be < 0.05 + 0.5
      expect(error.message).to include('lock "account": a job parked', "0 of the 1 replicas", "out of the line")
      expect(locker.backend.parked_entries("account", 10).map { |entry| JSON.parse(entry).first }).to eq(["jid-1"])
      await_acknowledgements(set)
      expect(holder.release_parked).to be(true) # the line moves on to the acknowledged job alone
      expect(client_of(set.primary).lrange("#{prefix}queue", 0, -1)).to eq(["jid-1"])
      expect(client_of(set.primary).get(full("account"))).to eq("jid-1")
    end

    it "blocking_lock keeps trying until its deadline, then raises NotReplicated" do
      await_acknowledgements(set)
      locker = replicated_locker
      error, took = with_replica_paused do
        timed_error(LockManager::NotReplicated) do
          locker.blocking_lock("report", timeout: 1.5) { raise "must not run" }
        end
      end

      measured(took: took.round(3))
      expect(took).to be_between(1.5, 2.5)
      expect(error.message).to include('"report"', "0 of the 1 replicas")
      expect(held_keys(client_of(set.primary), "#{prefix}*")).to eq([])
    end

    it "blocking_lock succeeds once the replica is resumed before its deadline" do
      await_acknowledgements(set)
      locker = replicated_locker
      replica = set.replica
      set.pause(replica)
      resumer = Thread.new do
        sleep 1
        set.resume(replica)
        monotonic
      end
      began = monotonic
      on_replica = locker.blocking_lock("report", timeout: 6) { client_of(replica).get(full("report")) }
      took = monotonic - began
      resumed_at = resumer.value

      measured(took: took.round(3), after_resume: (began + took - resumed_at).round(3))
      expect(on_replica).to be_a(String)
      expect(took).to be_between(0.9, 3)
      expect(held_keys(client_of(set.primary), "#{prefix}*")).to eq([])
    ensure
      resumer&.join
      set.resume(replica) if replica
    end
  end

  describe "through failovers (fresh sets)" do
    let(:fresh) { own_server(RedisSentinelSet) }

    it "a grant acknowledged before the primary is SIGKILLed is still held on the new primary, and the next " \
       "fencing token is larger", timeout: 120 do
      await_acknowledgements(fresh)
      locker = replicated_locker(fresh)
      lock = locker.try_lock("report", timeout: 60)

      old = fresh.kill_primary
      survivor = fresh.wait_for_failover(timeout: 30)
      primary = client_of(survivor)
      expect(primary.get(full("report"))).to eq(lock.token)
      expect(primary.pttl(full("report"))).to be > 30_000
      expect(lock.owned?).to be(true)
      expect(locker_of(fresh).try_lock("report")).to be_nil # not granted twice
      # No replica now: nothing is granted.
      expect { locker.try_lock("other") }.to raise_error(LockManager::NotReplicated, /"other".*0 of the 1/)

      fresh.restart_old_primary
      fresh.wait_until_replica(old, timeout: 45)
      await_acknowledgements(fresh)
      expect(lock.release).to be(true)
      again = locker.try_lock("report", timeout: 30)
      expect(again.fencing_token).to be > lock.fencing_token
      expect(client_of(old).get(full("report"))).to eq(again.token) # acknowledged by the old primary, a replica
      expect(again.release).to be(true)
      expect(held_keys(primary, "#{prefix}*")).to eq([])
    end

    it "through a manual SENTINEL FAILOVER: blocking callers all get in, one at a time", timeout: 90 do
      await_acknowledgements(fresh)
      locker = replicated_locker(fresh, pool_size: 6)
      old = fresh.primary
      running = true
      runs = Queue.new
      threads = Array.new(3) do
        Thread.new do
          outcomes = []
          while running
            outcomes << begin
              # A release lost on the old primary after the promotion leaves the lock on the new
              # one for its timeout (see sentinel_faults_spec.rb); the waits outlast that.
              locker.blocking_lock("shared", timeout: 3, wait: 30) do |lock|
                runs << [monotonic, lock.fencing_token, :start]
                sleep 0.05
                runs << [monotonic, lock.fencing_token, :finish]
                :ran
              end
            rescue LockManager::Error => e
              e
            end
          end
          outcomes
        end
      end
      sleep 0.5

      issued_at = monotonic
      expect(client_of(fresh.sentinels.first).call("SENTINEL", "FAILOVER", fresh.name)).to eq("OK")
      fresh.wait_for_failover(old, timeout: 30)
      fresh.wait_until_replica(old, timeout: 45)
      sleep 1.5 # locks on the new primary, once the old one acknowledges as its replica
      running = false
      outcomes = threads.flat_map(&:value)
      events = Array.new(runs.size) { runs.pop }.sort_by(&:first)

      measured(failover_and_replica: (monotonic - 1.5 - issued_at).round(3), blocks: events.size / 2,
               outcomes: outcomes.map { |o| o.is_a?(Symbol) ? o : o.class }.tally)
      expect(outcomes.uniq).to eq([:ran])
      expect(events.map(&:last)).to eq(%i[start finish] * (events.size / 2)) # never two blocks at once
      expect(events.each_slice(2).map { |start, finish| start[1] == finish[1] }).to all(be(true))
      tokens = events.map { |event| event[1] }.uniq
      expect(tokens).to eq(tokens.sort)
      expect(events.count { |at, _, kind| kind == :start && at > issued_at + 3 }).to be > 0 # after it, too
    end
  end

  # A window limiter (40 an hour) asked by 4 threads, each every 50 ms, through a failover: the replica's
  # link is cut first (its reconnections fail AUTH, so nothing reaches it any more; Redis would otherwise
  # buffer the stream for a paused replica and apply it after), the decisions made meanwhile exist on the
  # primary only, then the primary is SIGKILLed and the replica promoted. With min_replicas: 1 those
  # decisions raise NotReplicated (given back), so the promoted replica has every unit a caller was told
  # it got; without it they are forgotten and the window admits them again.
  describe "a window limiter through a failover of a primary that the replica had stopped following" do
    let(:fresh) { own_server(RedisSentinelSet) }
    let(:limit) { 40 }

    # Threads asking `limiter` every 50 ms until the returned lambda is called (it joins them). A
    # decision that raised counts as its error's class, never as admitted; any other error fails the example.
    def hammer(limiter, tally, threads: 4)
      running = true
      workers = Array.new(threads) do
        Thread.new do
          while running
            tally << begin
              limiter.try_acquire.admitted? ? :admitted : :refused
            rescue LockManager::NotReplicated, LockManager::ConnectionError => e
              e.class
            end
            sleep 0.05
          end
        end
      end
      lambda do
        running = false
        workers.each(&:join)
      end
    end

    # The replica drops its link and cannot make it again: its primary has no password, so AUTH fails.
    def cut_replication(replica)
      client = client_of(replica)
      client.call("CONFIG", "SET", "masterauth", "not-the-primary-s")
      client.call("CLIENT", "KILL", "TYPE", "master")
      eventually(timeout: 5) { client.info("replication")["master_link_status"] == "down" }
    end

    # Windows are aligned to Redis's clock: a run that crossed an hour would count in two of them.
    def clear_of_the_hour(topology, run_for:)
      seconds, = client_of(topology.primary).call("TIME").map(&:to_i)
      left = 3600 - (seconds % 3600)
      sleep left + 0.1 if left < run_for
    end

    # Until the tally has `count` admitted decisions, or `within` seconds passed.
    def until_admitted(tally, count, within:)
      deadline = monotonic + within
      sleep 0.01 until tally[:admitted] >= count || monotonic > deadline
    end

    # The run both examples make: ~10 admitted with the link up, then the link cut for 1 s (or until
    # the limit is spent), the primary SIGKILLed, the replica's password fixed, and the failover.
    def run_through_failover(locker)
      clear_of_the_hour(fresh, run_for: 60)
      tally = LimiterTally.new
      exports = LockManager::Limiter.window("exports", limit, per: 3600, locker: locker)
      stop = hammer(exports, tally)
      until_admitted(tally, 10, within: 10)
      before_cut = tally[:admitted]
      survivor = fresh.replica
      cut_replication(survivor)
      on_replica = used_on(survivor, "exports")
      until_admitted(tally, limit, within: 1)
      before_kill = tally[:admitted]
      fresh.kill_primary
      client_of(survivor).call("CONFIG", "SET", "masterauth", "")
      expect(fresh.wait_for_failover(timeout: 30)).to eq(survivor)
      yield
      stop.call
      { before_cut: before_cut, on_replica: on_replica, before_kill: before_kill, **tally.to_h }
    end

    # What a limiter has admitted in its window, as the server `node` (a replica cut off) has it:
    # the admissions that went on while the link was being cut replicated too.
    def used_on(node, name)
      LockManager::Admin.new(LockManager::Locker.new(redis_url: node.url, key_prefix: prefix))
                        .limiters(name).first&.used.to_i
    end

    it "with min_replicas: 1 never admits more than its limit: what the replica missed raised NotReplicated",
       timeout: 120 do
      await_acknowledgements(fresh)
      counts = run_through_failover(replicated_locker(fresh, pool_size: 4)) do
        fresh.restart_old_primary # nothing is admitted until a replica acknowledges again
        fresh.wait_until_replica(fresh.replica, timeout: 45)
        await_acknowledgements(fresh)
        sleep 1.5 # enough for the rest of the window to be spent
      end

      measured(**counts)
      expect(counts.fetch("admitted")).to be <= limit
      expect(counts.fetch("admitted")).to be > counts[:before_kill] # it went on after the failover
      expect(counts[:before_kill]).to eq(counts[:before_cut]) # nothing admitted while the replica was cut off
      expect(counts.fetch("LockManager::NotReplicated")).to be > 0
      expect(counts.fetch("refused")).to be > 0 # the limit was reached
    end

    # Parked jobs through the same failover: with min_replicas: 1 a job is parked only once the replica
    # has it, so the promoted replica's line holds every job that was told it is parked, and no other.
    it "with min_replicas: 1 keeps every job it said was parked: the promoted replica's line is theirs",
       timeout: 120 do
      await_acknowledgements(fresh)
      locker = replicated_locker(fresh)
      holder = locker.adopt("account", "jid-holder", timeout: 60)
      park = lambda do |jid|
        parking = Thread.new do
          locker.park("account", jid, ttl: 5, grace: 1, most: nil, schedule: "#{prefix}schedule", fallback: "{}",
                                      push: [["LPUSH", "#{prefix}queue", jid]])
        end
        parking.report_on_exception = false
        parking.value
      rescue LockManager::NotReplicated
        :not_replicated
      end
      told = %w[jid-1 jid-2 jid-3].map { |jid| [jid, park.call(jid)] }
      survivor = fresh.replica
      cut_replication(survivor)
      told += %w[jid-4 jid-5].map { |jid| [jid, park.call(jid)] }
      fresh.kill_primary
      client_of(survivor).call("CONFIG", "SET", "masterauth", "")
      expect(fresh.wait_for_failover(timeout: 30)).to eq(survivor)

      parked = told.select { |_, reply| reply.is_a?(Array) }.map(&:first)
      expect(told.to_h.values_at("jid-4", "jid-5")).to eq(%i[not_replicated not_replicated])
      expect(parked).to eq(%w[jid-1 jid-2 jid-3])
      line = eventually(timeout: 15) do # the Locker finds the new primary through the sentinels
        locker.backend.parked_entries("account", 10)
      rescue LockManager::ConnectionError
        nil
      end
      expect(line.map { |entry| JSON.parse(entry).first }).to eq(parked)
      expect(holder.release_parked).to be(true) # the holder's lock lived on the replica too: the line moves
    end

    it "without min_replicas admits again what the replica had not received", timeout: 120 do
      await_acknowledgements(fresh)
      counts = run_through_failover(locker_of(fresh, pool_size: 4)) { sleep 1.5 }

      measured(**counts)
      expect(counts[:before_kill]).to eq(limit) # spent on the primary alone
      expect(counts[:on_replica]).to be >= counts[:before_cut]
      # The promoted replica admits the rest of the limit again, from what it had received.
      expect(counts.fetch("admitted")).to be >= (2 * limit) - counts[:on_replica]
    end
  end

  describe "on a standalone Redis without a replica" do
    it "raises NotReplicated: 0 of the 1 replicas, and leaves nothing behind" do
      locker = new_locker(min_replicas: 1)

      error, took = timed_error(LockManager::NotReplicated) do
        locker.nonblocking_lock("report") { raise "must not run" }
      end
      expect(took).to be < 0.05 + 0.5
      expect(error.message).to include('lock "report"', "0 of the 1 replicas")
      expect { locker.try_lock("report") }.to raise_error(LockManager::NotReplicated, /0 of the 1/)
      expect { locker.blocking_lock("report", timeout: 0.5) {} }.to raise_error(LockManager::NotReplicated)
      expect(held_keys(redis, "#{prefix}*")).to eq([])
      expect(new_locker.nonblocking_lock("report") { :free }.result).to eq(:free)
    end
  end
end
