# frozen_string_literal: true

require "spec_helper"
require "open3"
require "rbconfig"
require "lock_manager/admin"
require_relative "../support/parking"
require_relative "../support/topologies"

# exe/lock_manager run as a subprocess, as an operator runs it, against the suite's Redis (and the
# shared Cluster and Sentinel set-ups), its settings from the environment and from flags.
RSpec.describe "exe/lock_manager" do
  include Parking

  let(:host) { token_host }
  let(:environment) { { "REDIS_URL" => redis_url, "LOCK_MANAGER_KEY_PREFIX" => prefix } }

  def command
    [RbConfig.ruby, "-I", File.expand_path("../../lib", __dir__), File.expand_path("../../exe/lock_manager", __dir__)]
  end

  # @return [Array(String, String, Integer)] stdout, stderr, exit status
  def run_cli(*args, stdin: "", env: environment)
    out, err, status = Open3.capture3(env, *command, *args, stdin_data: stdin)
    [out, err, status.exitstatus]
  end

  def held(key, **options)
    elsewhere.try_lock(key, timeout: 30, **options)
  end

  it "prints its usage with --help, and exits 2 on a usage error" do
    out, _, status = run_cli("--help")
    expect(status).to eq(0)
    expect(out).to include("list [PATTERN]", "show KEY", "release KEY", "watch [PATTERN]", "--yes", "REDIS_URL",
                           "LOCK_MANAGER_CLUSTER", "limiters [PATTERN]", "reset-limiter NAME",
                           "--kind KIND", "gcra, window, sliding", "parked KEY", "delete-parked KEY JID")

    [[], %w[frobnicate], %w[show], %w[show a b], %w[--limit x list], %w[--nope list], %w[reset-limiter],
     %w[reset-limiter a b], %w[limiters a b], %w[--kind rate reset-limiter a], %w[parked], %w[parked a b],
     %w[delete-parked a], %w[delete-parked a b c]].each do |args|
      out, err, status = run_cli(*args)
      expect([out, status]).to eq(["", 2]), args.inspect
      expect(err).to include("lock_manager --help"), args.inspect
    end
  end

  it "names in its help the variables LockManager::Configuration reads, as the README does" do
    out, = run_cli("--help")
    variables = LockManager::Configuration::ENVIRONMENT.values.flatten
    expect(variables).to all(satisfy { |name| out.include?(name) })
    expect(out).to include('bin/rails "lock_manager:list[report:*]"')

    readme = File.read(File.expand_path("../../README.md", __dir__))
    named = readme.scan(/\b(?:[A-Z]+_)*REDIS_URL\b|\bLOCK_MANAGER_[A-Z_]+\b/).uniq
    expect(named - variables).to eq([])
    expect(named).to include("LOCK_MANAGER_REDIS_URL")
  end

  it "lists the locks of a pattern with their holder, since, TTL and waiters" do
    held("report:1")
    held("report:2")
    held("other")
    elsewhere.claim(["job:9"], ["b9c1a1f0e2d34c5e6f7a8b9c"], [600])

    out, err, status = run_cli("list", "report:*")

    expect([err, status]).to eq(["", 0])
    lines = out.lines.map(&:chomp)
    expect(lines.first.split(/\s{2,}/)).to eq(["KEY", "HELD BY", "SINCE", "TTL", "WAITERS"])
    holder = "#{Regexp.escape(host)} pid #{Process.pid} thread \\d+"
    expect(lines[1]).to match(/\Areport:1\s+#{holder}\s+[\d.]+s ago\s+29\.\ds\s+0\z/)
    expect(lines[2]).to start_with("report:2 ")
    expect(lines.last).to eq(%(2 locks matching "report:*"))

    out, = run_cli("list")
    expect(out).to include("job b9c1a1f0e2d34c5e6f7a8b9c", "other ", "4 locks matching \"*\"")

    out, = run_cli("--limit", "1", "list")
    expect(out.lines.size).to eq(3)
    expect(out).to include("1 lock matching \"*\"; more not shown (--limit)")
  end

  it "shows a lock's holders and queued waiters; a missing lock exits 1" do
    lock = held("shown")
    waiter = Thread.new { new_locker.blocking_lock("shown", timeout: 20) {} }
    admin = LockManager::Admin.new(new_locker)
    eventually { admin.lock("shown").waiters.size == 1 }

    out, err, status = run_cli("show", "shown")

    expect([err, status]).to eq(["", 0])
    expect(out).to include("Lock shown (plain lock)", "1. #{host} pid #{Process.pid} thread ",
                           "token #{lock.token}", "Waiters, in queue order:\n  1. #{host} pid #{Process.pid}")
    missing = "lock_manager: no lock missing (nobody holds it or waits for it)\n"
    expect(run_cli("show", "missing")).to eq(["", missing, 1])
  ensure
    lock&.release
    waiter&.join
  end

  it "releases a lock only when told yes, or with --yes, and says so" do
    lock = held("stuck")

    out, err, status = run_cli("release", "stuck", stdin: "n\n")
    expect([out, status]).to eq(["", 1])
    holder = "#{host} pid #{Process.pid} thread #{Thread.current.native_thread_id}"
    expect(err).to eq("Release lock stuck held by #{holder}? " \
                      "[y/N] lock_manager: lock stuck not released\n")
    expect(lock.owned?).to be(true)

    _, err, status = run_cli("release", "stuck", stdin: "") # no answer (stdin at its end) is no
    expect(status).to eq(1)
    expect(err).to end_with("not released\n")
    expect(lock.owned?).to be(true)

    out, err, status = run_cli("release", "stuck", stdin: "y\n")
    expect([out, status]).to eq(["Released lock stuck\n", 0])
    expect(err).to start_with("Release lock stuck held by ")
    expect(lock.owned?).to be(false)

    other = held("again")
    out, err, status = run_cli("release", "--yes", "again")
    expect([out, err, status]).to eq(["Released lock again\n", "", 0])
    expect(other.owned?).to be(false)

    missing = "lock_manager: no lock again (nobody holds it or waits for it)\n"
    expect(run_cli("release", "-y", "again")).to eq(["", missing, 1])
  end

  it "says how many jobs are parked on a lock in the list and its page, and lists them with parked KEY" do
    hold_for_job("report:1", "holderjid")
    held("report:2")
    park_job("report:1", "j1", payload: sidekiq_job("j1", args: [1, "pdf"]))
    hostile = sidekiq_job("j2", klass: "Evil\e[2J", args: ["\e]0;pwned\a", "<b>"])
    park_job("report:1", "j2", payload: hostile)

    out, err, status = run_cli("list", "report:*")
    expect([err, status]).to eq(["", 0])
    expect(out.lines[1]).to match(/\Areport:1\s+job holderjid\s+-\s+[\d.]+s\s+0, 2 parked\n\z/)
    expect(out.lines[2]).to match(/\Areport:2 .*\s0\n\z/)

    out, err, status = run_cli("parked", "report:1")
    expect([err, status]).to eq(["", 0])
    lines = out.lines.map(&:chomp)
    expect(lines[0].split(/\s{2,}/)).to eq(%w[# JID CLASS QUEUE PARKED ARGS])
    expect(lines[1]).to match(/\A1\s+j1\s+ReportJob\s+#{parked_queue}\s+\S+ ago\s+\[1,"pdf"\]\z/)
    # No byte of a job's reaches the terminal as a control character: its class is quoted, its args are JSON.
    args = Regexp.escape('["\\u001b]0;pwned\\u0007","<b>"]')
    expect(lines[2]).to match(/\A2\s+j2\s+"Evil\\e\[2J"\s+#{parked_queue}\s+.* ago\s+#{args}\z/)
    expect(out).not_to include("\e", "\a")
    expect(lines[3]).to eq("2 parked jobs on lock report:1")
    out, = run_cli("--limit", "1", "parked", "report:1")
    expect(out.lines.last).to eq("1 parked job on lock report:1; more not shown (--limit)\n")
    expect(run_cli("parked", "report:2"))
      .to eq(["#  JID  CLASS  QUEUE  PARKED  ARGS\n0 parked jobs on lock report:2\n", "", 0])

    out, err, status = run_cli("show", "report:1")
    expect([err, status]).to eq(["", 0])
    first = %(1. job j1 ReportJob [1,"pdf"] in queue #{parked_queue}, parked )
    expect(out).to include("Parked jobs, first in line first:\n  #{first}")
    expect(out).not_to include("\e")
    expect(run_cli("show", "report:2").first).not_to include("Parked")
  end

  it "deletes a parked job when told yes, or with --yes; exits 1 for a job not parked there" do
    hold_for_job("line")
    %w[a b c].each { |jid| park_job("line", jid) }
    admin = LockManager::Admin.new(new_locker)

    expect(run_cli("delete-parked", "line", "b", stdin: "n\n"))
      .to eq(["", "Delete job b parked on lock line? It will not run. [y/N] lock_manager: job b parked on lock line " \
                  "not deleted\n", 1])
    expect(admin.parked("line").map(&:jid)).to eq(%w[a b c])

    out, err, status = run_cli("delete-parked", "line", "b", stdin: "y\n")
    expect([out, status]).to eq(["Deleted job b parked on lock line: it will not run\n", 0])
    expect(err).to start_with("Delete job b parked on lock line? ")
    expect(admin.parked("line").map(&:jid)).to eq(%w[a c])

    expect(run_cli("delete-parked", "--yes", "line", "a"))
      .to eq(["Deleted job a parked on lock line: it will not run\n", "", 0])
    expect(run_cli("delete-parked", "-y", "line", "a")).to eq(["", "lock_manager: no job a parked on lock line\n", 1])
    expect(admin.parked("line").map(&:jid)).to eq(%w[c])
    expect(admin.lock("line").holders.map(&:jid)).to eq(["holder-line"])
    expect(pushed_jids).to eq([])
  end

  it "releases a lock to its first parked job, and a lock that expired with jobs parked on it" do
    hold_for_job("handed")
    %w[a b].each { |jid| park_job("handed", jid) }
    admin = LockManager::Admin.new(new_locker)

    out, err, status = run_cli("release", "handed", stdin: "y\n")
    expect([out, status]).to eq(["Released lock handed; the first of 2 parked jobs took it\n", 0])
    expect(err).to eq("Release lock handed held by job holder-handed? [y/N] ")
    expect(admin.lock("handed").holders.map(&:jid)).to eq(["a"])
    expect(pushed_jids).to eq(["a"])

    hold_for_job("expired", seconds: 0.5)
    park_job("expired", "c")
    eventually { redis.exists("#{prefix}expired").zero? } # its holder died: no release came
    out, err, status = run_cli("release", "expired", stdin: "y\n")
    expect(err).to eq("Release lock expired held by nobody (0 waiters, 1 parked job)? [y/N] ")
    expect([out, status]).to eq(["Released lock expired; the first of 1 parked job took it\n", 0])
    expect(admin.lock("expired").holders.map(&:jid)).to eq(["c"])
    expect(pushed_jids).to eq(%w[c a])
  end

  def use(limiter, times)
    Array.new(times) { limiter.try_acquire.admitted? }.count(true)
  end

  it "lists the rate limiters of a pattern: kind, rule, used, remaining, next free and reset after" do
    expect([use(LockManager::Limiter.new("api:hourly", rate: 10, per: 3600, burst: 3, locker: elsewhere), 4),
            use(LockManager::Limiter.window("api:exports", 10, per: 86_400, locker: elsewhere), 4),
            use(LockManager::Limiter.sliding_window("api:login 1.2.3.4", 5, per: 60, locker: elsewhere), 6),
            use(LockManager::Limiter.window("other", 10, per: 86_400, locker: elsewhere), 1)]).to eq([3, 4, 5, 1])
    held("api:lock") # a lock, not a limiter: not listed

    out, err, status = run_cli("limiters", "api:*")

    expect([err, status]).to eq(["", 0])
    lines = out.lines.map(&:chomp)
    expect(lines.first.split(/\s{2,}/)).to eq(["NAME", "KIND", "RULE", "USED", "REMAINING", "NEXT FREE", "RESET AFTER"])
    expect(lines[1])
      .to match(/\Aapi:exports\s+window\s+10 per 86400s window\s+4\s+6\s+now\s+(\d+[hm]\d\d[ms]|[\d.]+s)\z/)
    expect(lines[2])
      .to match(/\Aapi:hourly\s+gcra\s+1 per 360s, burst 3\s+3\s+0\s+in (5m5\d|6m00)s\s+(17m5\d|18m00)s\z/)
    minute = "(5\\d\\.\\ds|60\\.0s|1m00s)"
    expect(lines[3]) # a name with a space is quoted
      .to match(/\A"api:login 1\.2\.3\.4"\s+sliding\s+5 in any 60s\s+5\s+0\s+in #{minute}\s+#{minute}\z/)
    expect(lines.drop(4)).to eq([%(3 limiters matching "api:*")])

    out, = run_cli("limiters")
    expect(out.lines.drop(1).map { |line| line.split.first }).to eq(%w[api:exports api:hourly "api:login other 4])
    out, = run_cli("--limit", "2", "limiters")
    expect(out.lines.size).to eq(4)
    expect(out.lines.last).to eq(%(2 limiters matching "*"; more not shown (--limit)\n))
  end

  it "resets a limiter by name, every kind of it or --kind's, and exits 1 when it had counted nothing" do
    window = LockManager::Limiter.window("shared", 2, per: 86_400, locker: elsewhere) # windows end at midnight UTC
    rate = LockManager::Limiter.new("shared", rate: 1, per: 3600, burst: 2, locker: elsewhere)
    kept = LockManager::Limiter.window("kept", 2, per: 86_400, locker: elsewhere)
    expect([use(window, 2), use(rate, 2), use(kept, 1)]).to eq([2, 2, 1])
    admin = LockManager::Admin.new(new_locker)

    expect(run_cli("reset-limiter", "--kind", "window", "shared"))
      .to eq(["Reset limiter shared (window): it admits its whole rule again\n", "", 0])
    expect(admin.limiters.map { |l| [l.name, l.kind, l.used] }).to eq([["kept", :window, 1], ["shared", :gcra, 2]])
    expect(run_cli("reset-limiter", "-k", "window", "shared"))
      .to eq(["", "lock_manager: no limiter shared (window) (it has counted nothing)\n", 1])

    expect(run_cli("reset-limiter", "shared")).to eq(["Reset limiter shared: it admits its whole rule again\n", "", 0])
    expect(run_cli("reset-limiter", "shared"))
      .to eq(["", "lock_manager: no limiter shared (it has counted nothing)\n", 1])
    expect(admin.limiters.map { |l| [l.name, l.kind, l.used] }).to eq([["kept", :window, 1]])
    expect([use(window, 3), use(rate, 3), use(kept, 2)]).to eq([2, 2, 1])
  end

  it "watches a pattern, a table per --interval, until Ctrl-C (exit 0)" do
    held("watched")
    Open3.popen3(environment, *command, "watch", "watch*", "--interval", "0.2") do |_in, out, err, wait|
      frames = []
      until frames.size >= 2
        line = out.gets or raise "watch ended: #{err.read}"
        frames << line if line.start_with?("lock_manager watch")
        expect(line).to match(/\A(watched |lock_manager watch|KEY|\n)/)
      end
      Process.kill(:INT, wait.pid)
      expect(wait.join(5)&.value&.exitstatus).to eq(0)
      expect(frames).to all(include(%(lock_manager watch "watch*": 1 lock at )))
      expect(err.read).to eq("")
    end
  end

  it "says why in one line, and exits 1, when Redis is down or a setting is wrong" do
    out, err, status = run_cli("list", env: environment.merge("REDIS_URL" => closed_url))
    expect([out, status]).to eq(["", 1])
    expect(err).to match(/\Alock_manager: locks matching "\*": cannot talk to Redis at 127\.0\.0\.1:\d+: .+\n\z/)

    out, err, status = run_cli("show", "x", env: environment.merge("REDIS_URL" => closed_url))
    expect([out, status]).to eq(["", 1])
    expect(err.lines.size).to eq(1)
    expect(err).to start_with(%(lock_manager: lock "x": cannot talk to Redis))

    out, err, status = run_cli("limiters", "api:*", env: environment.merge("REDIS_URL" => closed_url))
    expect([out, status]).to eq(["", 1])
    expect(err).to match(/\Alock_manager: limiters matching "api:\*": cannot talk to Redis at 127\.0\.0\.1:\d+: .+\n\z/)
    _, err, status = run_cli("reset-limiter", "x", env: environment.merge("REDIS_URL" => closed_url))
    expect(status).to eq(1)
    expect(err).to match(/\Alock_manager: limiter "x": cannot talk to Redis .+\n\z/)

    _, err, status = run_cli("--prefix", "", "list")
    expect(status).to eq(2)
    expect(err).to start_with("lock_manager: key_prefix must not be empty")
  end

  it "takes its settings from flags over the environment" do
    held("flagged")
    LockManager::Locker.new(redis_url: redis_url, key_prefix: "#{prefix.chop}-b:").try_lock("elsewhere", timeout: 30)

    out, = run_cli("list", env: { "REDIS_URL" => closed_url, "LOCK_MANAGER_KEY_PREFIX" => "#{prefix.chop}-b:" })
    expect(out).to eq("")
    out, = run_cli("--redis-url", redis_url, "list", env: { "REDIS_URL" => closed_url,
                                                            "LOCK_MANAGER_KEY_PREFIX" => "#{prefix.chop}-b:" })
    expect(out).to include("elsewhere ")
    out, = run_cli("--prefix", prefix, "list", env: environment.merge("LOCK_MANAGER_KEY_PREFIX" => "nothing:"))
    expect(out).to include("flagged ")
  end

  it "lists a Redis Cluster's locks from LOCK_MANAGER_CLUSTER", :topology, timeout: 60 do
    cluster = RedisCluster.shared
    locker = LockManager::Locker.new(cluster: cluster.seed_urls, key_prefix: prefix)
    keys = cluster.keys_on_each_master(1, prefix: prefix).values.flatten
    keys.each { |key| locker.try_lock(key, timeout: 30) }

    env = { "LOCK_MANAGER_CLUSTER" => cluster.seed_urls.join(","), "LOCK_MANAGER_KEY_PREFIX" => prefix }
    out, err, status = run_cli("list", env: env)

    expect([err, status]).to eq(["", 0])
    expect(out.lines.drop(1).first(3).map { |line| line.split.first }).to eq(keys.sort)
    expect(run_cli("release", "--yes", keys.first, env: env)).to eq(["Released lock #{keys.first}\n", "", 0])
  end

  it "lists the locks of a Sentinel's primary from LOCK_MANAGER_SENTINELS and _SENTINEL_MASTER", :topology,
     timeout: 60 do
    set = RedisSentinelSet.shared
    LockManager::Locker.new(sentinels: set.sentinel_urls, sentinel_master: set.name, redis_url: set.master_url,
                            key_prefix: prefix).try_lock("primary", timeout: 30)

    env = { "LOCK_MANAGER_SENTINELS" => set.sentinel_urls.join(","), "LOCK_MANAGER_SENTINEL_MASTER" => set.name,
            "REDIS_URL" => set.master_url, "LOCK_MANAGER_KEY_PREFIX" => prefix }
    out, err, status = run_cli("list", env: env)

    expect([err, status]).to eq(["", 0])
    expect(out).to include("primary ", "1 lock matching")
  end
end
