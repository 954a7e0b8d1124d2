# frozen_string_literal: true

require "spec_helper"
require_relative "../support/topologies"
require_relative "../support/process_helpers"
require_relative "../support/cross_process"

# Locks through Sentinel: the seed's stories on the suite's shared RedisSentinelSet (nothing here
# kills or pauses its nodes), the same across real processes, and passwords and unreachable or
# misnamed sentinels on fresh sets of their own.
RSpec.describe "Locks through Sentinel", :topology do
  include ProcessHelpers

  let(:set) { RedisSentinelSet.shared }

  after { stop_all }

  def primary_client(topology = set)
    client_of(topology.primary)
  end

  # A Locker that asks `topology`'s sentinels for the primary.
  def sentinel_locker(topology = set, **options)
    LockManager::Locker.new(sentinels: topology.sentinel_urls, sentinel_master: topology.name,
                            redis_url: topology.master_url, key_prefix: prefix, **options)
  end

  def full(key)
    "#{prefix}#{key}"
  end

  # [[label, started, finished]] from a queue of [:start | :finish, label, time] events.
  def intervals(events)
    log = Array.new(events.size) { events.pop }
    log.group_by { |event| event[1] }.map do |label, pair|
      [label, pair.find { |e| e[0] == :start }[2], pair.find { |e| e[0] == :finish }[2]]
    end
  end

  def overlapping?(first, second)
    first[1] < second[2] && second[1] < first[2]
  end

  describe "the seed's stories" do
    it "finds the primary through the sentinels: redis_url's host and port are not used" do
      locker = LockManager::Locker.new(sentinels: set.sentinel_urls, sentinel_master: set.name,
                                       redis_url: closed_url, key_prefix: prefix)
      lock = locker.try_lock("report", timeout: 30)
      primary = primary_client

      expect(lock).to be_a(LockManager::Lock)
      expect(primary.get(full("report"))).to eq(lock.token)
      expect(primary.pttl(full("report"))).to be_between(25_000, 30_000)
      eventually(timeout: 15) { primary.wait(1, 500) == 1 }
      expect(client_of(set.replica).get(full("report"))).to eq(lock.token) # written where replicas follow
      expect(lock.release).to be(true)
      expect(held_keys(primary, "#{prefix}*")).to eq([])
    end

    it "five nonblocking callers while the first works: one runs, four are skipped" do
      locker = sentinel_locker(pool_size: 5)
      gate = Queue.new
      threads = Array.new(5) do |i|
        Thread.new do
          gate.pop
          locker.nonblocking_lock("MyWorker", timeout: 30) do
            sleep 1.0
            "MyWorker result #{i}"
          end
        end
      end
      5.times { gate << true }
      results = threads.map(&:value)

      ran = results.select(&:run?)
      expect(ran.size).to eq(1)
      expect(ran.first.result).to match(/\AMyWorker result \d\z/)
      expect(results.reject(&:run?).map(&:result)).to eq([nil] * 4)
      expect(held_keys(primary_client, "#{prefix}*")).to eq([])
    end

    it "three blocking callers run one after another, never overlapping" do
      locker = sentinel_locker(pool_size: 4)
      events = Queue.new
      threads = Array.new(3) do |i|
        Thread.new do
          locker.blocking_lock("MyWorker", timeout: 10) do
            events << [:start, i, monotonic]
            sleep 0.3
            events << [:finish, i, monotonic]
            i
          end
        end
      end
      values = threads.map(&:value)
      runs = intervals(events).sort_by { |run| run[1] }

      expect(values).to contain_exactly(0, 1, 2)
      expect(runs.size).to eq(3)
      runs.each_cons(2) { |first, second| expect(second[1]).to be >= first[2] }
      expect(held_keys(primary_client, "#{prefix}*")).to eq([])
    end

    it "per-ID keys: users 1 and 2 are processed in parallel, a second user 1 is skipped" do
      locker = sentinel_locker(pool_size: 4)
      events = Queue.new
      inside = Queue.new
      work = lambda do |user_id, label|
        locker.nonblocking_lock("user:#{user_id}", timeout: 30) do
          events << [:start, label, monotonic]
          inside << label
          sleep 0.8
          events << [:finish, label, monotonic]
        end
      end
      first = Thread.new { work.call(1, :first) }
      expect(inside.pop).to eq(:first)
      second = Thread.new { work.call(2, :second) }
      duplicate = Thread.new { work.call(1, :duplicate) }
      results = [first, second, duplicate].map(&:value)
      runs = intervals(events).to_h { |label, started, finished| [label, [label, started, finished]] }

      expect(results.map(&:run?)).to eq([true, true, false])
      expect(runs.keys).to contain_exactly(:first, :second)
      expect(overlapping?(runs[:first], runs[:second])).to be(true)
    end

    it "limit: 2 admits two holders at once and skips a third" do
      locker = sentinel_locker(pool_size: 4)
      inside = Queue.new
      leave = Queue.new
      holders = Array.new(2) do
        Thread.new { locker.nonblocking_lock("partner-api", limit: 2, timeout: 30) { (inside << 1) && leave.pop } }
      end
      2.times { inside.pop }

      third = locker.nonblocking_lock("partner-api", limit: 2) { :never }
      2.times { leave << :done }
      results = holders.map(&:value)

      expect(third.run?).to be(false)
      expect(results.map(&:run?)).to eq([true, true])
      expect(results.map(&:fencing_token).uniq.size).to eq(2)
      expect(locker.nonblocking_lock("partner-api", limit: 2) { :now }.result).to eq(:now)
      expect(held_keys(primary_client, "#{prefix}*")).to eq([])
    end

    it "fair: true serves waiters in their arrival order" do
      locker = sentinel_locker(pool_size: 6)
      holder = sentinel_locker.try_lock("k", timeout: 30)
      primary = primary_client
      order = Queue.new
      threads = Array.new(4) do |i|
        thread = Thread.new { locker.blocking_lock("k", timeout: 20, fair: true) { order << i } }
        eventually { primary.zcard(queue_key(full("k"))) == i + 1 } # queued before the next arrives
        thread
      end
      holder.release
      threads.each(&:join)

      expect(Array.new(order.size) { order.pop }).to eq([0, 1, 2, 3])
      expect(held_keys(primary, "#{prefix}*")).to eq([])
    end

    it "renew: true keeps a lock past its timeout while its block runs" do
      locker = sentinel_locker
      other = sentinel_locker
      primary = primary_client
      seen = []
      result = locker.nonblocking_lock("import", timeout: 0.6, renew: true) do |lock|
        3.times do
          sleep 0.5
          seen << [primary.pttl(full("import")), other.try_lock("import"), lock.lost?]
        end
        :imported
      end

      expect(seen.size).to eq(3) # 1.5 s in, for a 0.6 s timeout
      seen.each { |pttl, taken, lost| expect([pttl, taken, lost]).to match([be > 0, nil, false]) }
      expect([result.result, result.lost?]).to eq([:imported, false])
      expect(held_keys(primary, "#{prefix}*")).to eq([])
    end
  end

  describe "across processes" do
    include CrossProcess

    def child_env
      { "LM_SENTINELS" => set.sentinel_urls.join(","), "LM_MASTER" => set.name, "LM_URL" => set.master_url,
        "LM_PREFIX" => prefix }
    end

    # For CrossProcess's children.
    def topology_env
      child_env
    end

    def child(body)
      ruby_child(<<~RUBY, child_env)
        $stdout.sync = true
        require "lock_manager"
        locker = LockManager::Locker.new(sentinels: ENV.fetch("LM_SENTINELS").split(","),
                                         sentinel_master: ENV.fetch("LM_MASTER"),
                                         redis_url: ENV.fetch("LM_URL"), key_prefix: ENV.fetch("LM_PREFIX"))
        #{body}
      RUBY
    end

    it "one process holds: another is skipped, a third waits and is woken by the release, within 0.5 s" do
      holder = child(<<~RUBY)
        locker.nonblocking_lock("report", timeout: 30) do
          puts "holding"
          $stdin.gets
        end
        puts "released"
      RUBY
      expect(holder.gets).to eq("holding")
      skipped = child('puts(locker.nonblocking_lock("report") { :ran }.run? ? "ran" : "skipped")')
      waiter = child(<<~RUBY)
        puts "waiting"
        locker.blocking_lock("report", timeout: 20) { puts Process.clock_gettime(Process::CLOCK_MONOTONIC) }
      RUBY
      expect(waiter.gets).to eq("waiting")
      expect(skipped.gets).to eq("skipped")
      primary = primary_client
      eventually { primary.zcard(queue_key(full("report"))) == 1 } # the waiter is queued

      released_at = monotonic
      holder.puts("release")
      expect(holder.gets).to eq("released")
      woke_at = Float(waiter.gets)

      expect(woke_at - released_at).to be_between(0, 0.5)
      expect([holder, skipped, waiter].map { |process| process.wait&.exitstatus }).to eq([0, 0, 0])
      expect(held_keys(primary, "#{prefix}*")).to eq([])
    end

    it "limit: 2 lets at most 2 of 4 processes in at once (and 2 do get in), over all their cycles, with growing " \
       "fencing tokens", timeout: 30 do
      children = lock_processes(4, "cycles", ["partner-api"], cycles: 4, limit: 2, hold: 0.15, timeout: 10)
      children.each { |child| child.puts("go") }
      runs, statuses = finished_runs(children)

      expect(statuses).to eq([0] * 4)
      expect(runs.map { |run| run.fetch("key") }.uniq).to eq(["partner-api"])
      expect(runs.map { |run| run.fetch("child") }.tally).to eq({ 0 => 4, 1 => 4, 2 => 4, 3 => 4 })
      expect(peak_inside(runs)).to eq(2), runs.map { |run| run.values_at("entered", "left") }.inspect
      tokens = runs.map { |run| run.fetch("token") }
      expect(tokens).to all(be_an(Integer))
      expect(tokens.uniq.size).to eq(16)
      expect(token_order_violations(runs)).to eq([])
      expect(held_keys(primary_client, "#{prefix}*")).to eq([])
    end

    it "fair: true gives the lock to 3 processes in the order they queued behind a holding process", timeout: 30 do
      holder = lock_process("hold", ["k"], timeout: 10)
      waiters = lock_processes(3, "cycles", ["k"], fair: true, hold: 0.05, timeout: 10)
      primary = primary_client
      holder.puts("go")
      expect(reports_until(holder, "holding")).to eq([])
      waiters.each_with_index do |waiter, n|
        waiter.puts("go")
        eventually(timeout: 5) { primary.zcard(queue_key(full("k"))) == n + 1 } # behind the previous one
      end

      holder.puts("release")
      held = reports_until(holder, "done")
      runs, statuses = finished_runs(waiters)

      expect(holder.wait&.exitstatus).to eq(0)
      expect(statuses).to eq([0, 0, 0])
      expect(held.map { |report| report.values_at("key", "run", "lost") }).to eq([["k", true, false]])
      order = entry_order(runs)
      expect(order.map(&:first)).to eq([0, 1, 2]), order.inspect
      tokens = [held.first.fetch("token")] + order.map(&:last)
      expect(tokens).to eq(tokens.sort.uniq)
      expect(peak_inside(runs)).to eq(1)
      expect(held_keys(primary, "#{prefix}*")).to eq([])
    end

    it "renew: true keeps a process's lock (timeout: 1) for 3 s, while this process is refused it, and frees it " \
       "after", timeout: 30 do
      child = lock_process("hold", ["import"], timeout: 1, renew: true)
      other = sentinel_locker
      primary = primary_client
      child.puts("go")
      expect(reports_until(child, "holding")).to eq([])

      attempts = []
      started = monotonic
      while monotonic - started < 3
        attempts << [other.nonblocking_lock("import") { :taken }.run?, primary.pttl(full("import"))]
        sleep 0.1
      end
      child.puts("release")
      held = reports_until(child, "done")

      expect(child.wait&.exitstatus).to eq(0)
      expect(held.map { |report| report.values_at("key", "run", "lost_inside", "lost") })
        .to eq([["import", true, false, false]])
      expect(held.first.fetch("held_for")).to be >= 3
      expect(attempts.size).to be >= 10 # over 3 s: it was tried all along
      expect(attempts.map(&:first)).to all(be(false)), "taken while renewed: #{attempts.inspect}"
      expect(attempts.map(&:last)).to all(be_between(1, 1000)) # renewed: it outlived its 1 s
      expect(other.nonblocking_lock("import") { :free }.result).to eq(:free)
      expect(held_keys(primary, "#{prefix}*")).to eq([])
    end
  end

  describe "a misnamed master" do
    it "gives a ConnectionError naming the master, within about connect_timeout" do
      locker = sentinel_locker(sentinel_master: "no-such-master", connect_timeout: 0.5)

      error, took = timed_error(LockManager::ConnectionError) { locker.nonblocking_lock("k") { raise "must not run" } }
      expect(error.message).to include('"no-such-master"', '"k"')
      expect(took).to be < 1.0
      expect { locker.try_lock("k") }.to raise_error(LockManager::ConnectionError, /"no-such-master"/)
      error, took = timed_error(LockManager::ConnectionError) do
        locker.blocking_lock("k", timeout: 1) { raise "must not run" }
      end
      expect(error.message).to include('"no-such-master"')
      expect(took).to be_between(1.0, 2.0) # a wait rides it out until its deadline
      expect(held_keys(primary_client, "#{prefix}*")).to eq([])
    end
  end

  describe "every sentinel paused (SIGSTOP)" do
    let(:fresh) { own_server(RedisSentinelSet) }

    # Pauses every sentinel of `fresh` (the URLs are read before: the set asks its sentinels).
    def pause_sentinels
      urls = [fresh.sentinel_urls, fresh.master_url]
      fresh.sentinels.each { |sentinel| fresh.pause(sentinel) }
      urls
    end

    it "does not hang a call: it raises a ConnectionError within a few seconds (connect_timeout 0.5)" do
      sentinels, master_url = pause_sentinels
      locker = LockManager::Locker.new(sentinels: sentinels, sentinel_master: fresh.name, redis_url: master_url,
                                       key_prefix: prefix, connect_timeout: 0.5)

      error, took = timed_error(LockManager::ConnectionError) { locker.nonblocking_lock("k") { raise "must not run" } }
      expect(took).to be < 5
      expect(error.message).to include('"k"')
    ensure
      fresh.sentinels.each { |sentinel| fresh.resume(sentinel) }
    end

    # Each paused sentinel costs 2 x connect_timeout (the handshake, then the question): 6 s with the
    # defaults (connect_timeout 1, pool_timeout 5).
    context "with the default settings" do
      def default_locker
        sentinels, master_url = pause_sentinels
        LockManager::Locker.new(sentinels: sentinels, sentinel_master: fresh.name, redis_url: master_url,
                                key_prefix: prefix)
      end

      it "nonblocking_lock raises a ConnectionError about the sentinels, not a PoolTimeout", :aggregate_failures do
        locker = default_locker

        error, took = timed_error(LockManager::Error) { locker.nonblocking_lock("k") { raise "must not run" } }
        expect(took).to be < 7
        expect(error).to be_a(LockManager::ConnectionError)
        expect(error.message).to include("sentinel")
        expect(error.message).not_to include("pooled connections are in use") # none is open
      ensure
        fresh.sentinels.each { |sentinel| fresh.resume(sentinel) }
      end

      it "blocking_lock (timeout: 2) raises a ConnectionError at its deadline", :aggregate_failures do
        locker = default_locker

        error, took = timed_error(LockManager::Error) { locker.blocking_lock("k", timeout: 2) { raise "must not run" } }
        expect(took).to be_between(2, 3.5)
        expect(error).to be_a(LockManager::ConnectionError)
      ensure
        fresh.sentinels.each { |sentinel| fresh.resume(sentinel) }
      end
    end
  end

  describe "passwords on the data nodes and on the sentinels" do
    let(:data_password) { "data-pw-#{SecureRandom.hex(6)}" }
    let(:sentinel_password) { "sentinel-pw-#{SecureRandom.hex(6)}" }
    let(:secured) { own_server(RedisSentinelSet, password: data_password, sentinel_password: sentinel_password) }
    let(:passwords) { [data_password, sentinel_password] }

    def expect_no_password(text)
      passwords.each { |password| expect(text).not_to include(password) }
      expect(text).not_to include("wrong-pw") # the wrong ones below are passwords too
    end

    it "work: locks are taken on the primary, with each password where it belongs" do
      expect(secured.sentinel_urls).to all(include(":#{sentinel_password}@"))
      expect(secured.master_url).to include(":#{data_password}@")
      locker = sentinel_locker(secured)
      primary = primary_client(secured)

      result = locker.nonblocking_lock("report", timeout: 30) { primary.exists?(full("report")) }
      expect([result.run?, result.result]).to eq([true, true])
      expect(locker.blocking_lock("report", timeout: 5) { :waited }).to eq(:waited)
      lock = locker.try_lock("report", timeout: 30)
      expect(primary.get(full("report"))).to eq(lock.token)
      expect(lock.release).to be(true)
      expect(held_keys(primary, "#{prefix}*")).to eq([])
    end

    it "never show: not in Locker#inspect, LockManager.config, nor any error message" do
      urls = secured.sentinel_urls
      master_url = secured.master_url
      locker = sentinel_locker(secured)
      expect(locker.nonblocking_lock("k") { :ok }.result).to eq(:ok)
      expect_no_password(locker.inspect)
      expect_no_password(locker.settings.inspect)

      LockManager.configure do |c|
        c.sentinels = urls
        c.sentinel_master = secured.name
        c.redis_url = master_url
        c.key_prefix = prefix
      end
      expect(LockManager::Locker.nonblocking_lock("k") { :shared }.result).to eq(:shared) # configured for real
      expect_no_password(LockManager.config.inspect)
      expect_no_password(LockManager.config.to_h.inspect)
      expect_no_password(LockManager.config.sentinels.inspect)
      expect_no_password(LockManager.locker.inspect)
      expect(LockManager.config.sentinels.size).to eq(3)

      errors = {
        wrong_master: -> { sentinel_locker(secured, sentinel_master: "not-#{secured.name}") },
        wrong_data_password: lambda {
          sentinel_locker(secured, redis_url: master_url.sub(data_password, "wrong-pw"))
        },
        wrong_sentinel_password: lambda {
          LockManager::Locker.new(sentinels: urls.map { |url| url.sub(sentinel_password, "wrong-pw") },
                                  sentinel_master: secured.name, redis_url: master_url, key_prefix: prefix)
        }
      }.transform_values do |build|
        timed_error(LockManager::Error) { build.call.nonblocking_lock("k") { raise "must not run" } }.first
      end
      expect(errors[:wrong_master]).to be_a(LockManager::ConnectionError)
      expect(errors[:wrong_master].message).to include("\"not-#{secured.name}\"")
      expect(errors[:wrong_data_password]).to be_a(LockManager::AuthenticationError)
      expect(errors[:wrong_sentinel_password]).to be_a(LockManager::ConnectionError)
      errors.each_value { |error| expect_no_password(error.message) }
      expect(held_keys(primary_client(secured), "#{prefix}*")).to eq([])
    end

    it "never show in the errors of sentinels that are paused or gone", timeout: 90 do
      urls = secured.sentinel_urls
      master_url = secured.master_url
      build = lambda do
        LockManager::Locker.new(sentinels: urls, sentinel_master: secured.name, redis_url: master_url,
                                key_prefix: prefix, connect_timeout: 0.5)
      end
      expect(build.call.nonblocking_lock("k") { :ok }.result).to eq(:ok)

      secured.sentinels.each { |sentinel| secured.pause(sentinel) }
      paused, took = timed_error(LockManager::Error) { build.call.nonblocking_lock("k") { raise "must not run" } }
      expect(took).to be < 5
      secured.sentinels.each { |sentinel| secured.kill(sentinel) } # SIGKILL: paused or not
      gone, took = timed_error(LockManager::Error) { build.call.nonblocking_lock("k") { raise "must not run" } }
      expect(took).to be < 2

      expect(paused).to be_a(LockManager::ConnectionError)
      expect(gone).to be_a(LockManager::ConnectionError)
      expect(gone.message).to match(/127\.0\.0\.1:(#{secured.sentinels.map(&:port).join("|")})\b/) # a sentinel
      [paused, gone].each { |error| expect_no_password(error.message) }
    ensure
      secured.sentinels.select(&:running?).each { |sentinel| secured.resume(sentinel) }
    end
  end
end
