# frozen_string_literal: true

require "open3"
require "rbconfig"
require "sidekiq"
require "spec_helper"
require "lock_manager/admin"
require_relative "../support/acl_rules"
require_relative "../support/fault_helpers"
require_relative "../support/sidekiq_client"
require_relative "../support/unique_jobs"

# The ACL rules of docs/acl.md (docs/acl/*.acl), on a redis-server of this file's own: a user with exactly
# them runs the core (locks, waits woken by a publication, semaphores, limiters), the jobs (a Sidekiq
# unique push, a parked job handed its lock) and admin (Admin, the command); a user of the read-only rule
# lists and cannot change anything; and a user missing any one part of the core rule is refused with
# PermissionError at once, or, for the parts that only carry wake-ups, loses those alone. Each example
# makes its users anew, on a server flushed before it.
RSpec.describe "The ACL rules of docs/acl.md" do
  include AclUsers
  include FaultHelpers

  before(:all) { @server = RedisServer.new.start }
  after(:all) { @server&.shutdown }

  include_context "a Sidekiq client of its own"

  let(:password) { "Acl-7d1e-pw" }
  # Sidekiq's own keys are its user's business: here the default user's.
  let(:user) { acl_user(admin, *rule(:core), *rule(:jobs), *rule(:admin), name: "lock_manager", password: password) }

  before do
    admin.flushall
    admin.script(:flush) # a script's first run is an EVAL
    admin.call("ACL", "LOG", "RESET")
  end

  # A rule as docs/acl.md gives it for this server: on Redis 7.2 and later (and Valkey), the core and
  # read-only users also get docs/acl/setinfo.acl.
  def rule(part)
    setinfo = %i[core readonly].include?(part) && admin.call("COMMAND", "INFO", "client|setinfo") != [nil]
    AclRules.rule(part, password: password) + (setinfo ? AclRules.rule(:setinfo, password: password) : [])
  end

  # A Locker of the default prefix, "lock:", the rules' own; waits that no publication ends pause up to 5 s.
  def locker(url, **options)
    LockManager::Locker.new(redis_url: url, key_prefix: "lock:", retry_interval: 5, **options)
  end

  # What Redis refused, but the CONFIG GET maxmemory-policy every Locker asks once (docs/acl.md).
  def refusals
    acl_refusals(admin).reject { |_, _, object, _| object == "config|get" }
  end

  # `waiter` waits for `key`, which a Locker of its own (another process's, as far as Redis can tell)
  # holds and releases once the waiter is queued.
  # @return [Array(Object, Float)] what the wait returned or raised, and when after the release it did
  def woken_wait(waiter, holder, key, **options)
    held = holder.try_lock(key, timeout: 30) or raise "#{key.inspect} is held already"
    wait = Thread.new { outcome_and_time { waiter.blocking_lock(key, timeout: 5, wait: 1, **options) { monotonic } } }
    queue = "lock_manager:*:queue:lock:#{key}"
    eventually(timeout: 2) { !wait.alive? || admin.keys(queue).any? }
    sleep 0.05 # its subscriber heard nothing yet: the release's publication is what wakes it
    released_at = monotonic
    held.release
    outcome, took = wait.value
    [outcome.is_a?(Float) ? :woken : outcome, outcome.is_a?(Float) ? outcome - released_at : took]
  rescue StandardError => e
    [e, 0.0]
  ensure
    # A waiter left running (its holder's release refused) would take the next example's key: its
    # connections outlive the user they logged in as, which the next example makes anew. Its
    # outcome is no longer wanted, so it is ended rather than waited out (its wait: 1).
    wait&.kill
    wait&.join
  end

  # Sidekiq's push of a job, as the park path stores it: its queue in the set of queues, the job in its queue.
  def sidekiq_push(jid)
    [%w[SADD queues default], ["LPUSH", "queue:default", JSON.generate("class" => "X", "args" => [], "jid" => jid)]]
  end

  # Parks the job `jid` on `key`, held by another job, as the Sidekiq middleware parks it.
  def park(locker, key, jid)
    locker.park(key, jid, ttl: 30, grace: 1, most: nil, schedule: "schedule", fallback: "{}", push: sidekiq_push(jid))
  end

  # What Admin lists, written by `locker`: the lock "held", the limiters "w" and "sw" with a unit each, and
  # the jobs `parked` parked on "job", which a job holds.
  # @return [LockManager::Lock] "held"
  def written_to_list(locker, parked:)
    held = locker.try_lock("held", timeout: 30)
    LockManager::Limiter.window("w", 10, per: 86_400, locker: locker).try_acquire # a window ends at a day's end
    LockManager::Limiter.sliding_window("sw", 10, per: 60, locker: locker).try_acquire
    locker.claim(["job"], ["holder"], [60])
    parked.each { |jid| park(locker, "job", jid) }
    held
  end

  # exe/lock_manager, as an operator runs it, as `url`'s user.
  # @return [Array(String, String, Process::Status)] stdout, stderr, status
  def run_cli(url, *args)
    Open3.capture3({ "REDIS_URL" => url, "LOCK_MANAGER_KEY_PREFIX" => "lock:" }, RbConfig.ruby, "-I",
                   File.expand_path("../../lib", __dir__), File.expand_path("../../exe/lock_manager", __dir__), *args)
  end

  # The core's calls as `url`'s user makes them, each bounded (a wait by 1 s).
  # @return [Hash{String => Array(Object, Float)}] what each returned or raised, and how long it took
  def core_calls(url)
    l = locker(url)
    other = locker(url)
    calls = {
      "nonblocking_lock" => -> { l.nonblocking_lock("k") { :ran }.result },
      "try_lock, refresh, release" => -> { (lock = l.try_lock("t", timeout: 5)) && [lock.refresh(5), lock.release] },
      "lock" => -> { l.lock("l", timeout: 5, wait: 1).release },
      "locked?" => -> { l.locked?("k") },
      "limit: 2" => lambda {
        l.nonblocking_lock("s", limit: 2) { other.nonblocking_lock("s", limit: 2) { 2 }.result }.result
      },
      "Limiter.new" => -> { LockManager::Limiter.new("g", rate: 10, per: 1, locker: l).try_acquire.admitted? },
      "Limiter.window" => -> { LockManager::Limiter.window("w", 10, per: 60, locker: l).try_acquire.admitted? },
      "Limiter.sliding_window" => lambda {
        LockManager::Limiter.sliding_window("sw", 10, per: 60, locker: l).try_acquire.admitted?
      },
      "Limiter.concurrent" => -> { LockManager::Limiter.concurrent("cc", 2, locker: l).within_limit { :ran } }
    }.transform_values { |call| outcome_and_time(&call) }
    calls["blocking_lock, woken"] = woken_wait(l, other, "c")
    calls["blocking_lock fair, woken"] = woken_wait(l, other, "f", fair: true)
    calls
  end

  it "docs/acl.md shows each rule as docs/acl/*.acl has it" do
    doc = File.read(File.expand_path("../../docs/acl.md", __dir__))
    expect(%i[core setinfo jobs admin readonly].reject { |part| doc.include?(AclRules.text(part)) }).to eq([])
  end

  it "core: every lock call and limiter works, a wait is woken by the release's publication, a renewed " \
     "lock lives on, and Redis refuses nothing" do
    calls = core_calls(user)
    renewed = locker(user).nonblocking_lock("r", timeout: 0.2, renew: true) { sleep 0.5 }

    expect(calls.transform_values(&:first)).to eq(
      "nonblocking_lock" => :ran, "try_lock, refresh, release" => [true, true], "lock" => true, "locked?" => false,
      "limit: 2" => 2, "Limiter.new" => true, "Limiter.window" => true, "Limiter.sliding_window" => true,
      "Limiter.concurrent" => :ran, "blocking_lock, woken" => :woken, "blocking_lock fair, woken" => :woken
    )
    # Told by the publication: without it the waiter would pause for up to 5 s (retry_interval).
    expect(calls.values_at("blocking_lock, woken", "blocking_lock fair, woken").map(&:last)).to all(be < 0.3)
    expect([renewed.run?, renewed.lost?]).to eq([true, false])
    expect(refusals).to eq([])
    expect(acl_refusals(admin).map { |_, _, object, name| [object, name] }.uniq).to eq([["config|get", "lock_manager"]])
  end

  it "jobs: a unique Sidekiq push claims and pushes in one script, a second is refused, a parked job is " \
     "pushed when the lock it waits for is released, and Redis refuses nothing" do
    use_locks("lock:", url: user)
    job = UniqueJobs::UntilExecutedJob
    jid = job.perform_async(1, 0)
    refused = job.perform_async(1, 0)
    key = "#{job.name}:#{Digest::SHA256.hexdigest(JSON.generate([1, 0]))[0, 32]}"
    l = LockManager.locker
    holder = l.adopt("held", "holder", timeout: 60) # as a parking job's lock is taken when it runs
    parked = park(l, "held", "parked-1")
    released = holder.release_parked

    expect(LockManager::Sidekiq::OnePush.possible?(@pool)).to be(true) # INFO, CLIENT INFO: the same Redis
    expect([jid, refused]).to match([String, nil])
    expect(admin.get("lock:#{key}")).to eq(jid)
    expect([parked, released]).to eq([[:parked, 1], true])
    expect(admin.get("lock:held")).to eq("parked-1")
    expect(admin.lrange("queue:default", 0, -1).map { |entry| JSON.parse(entry)["jid"] }).to eq(["parked-1", jid])
    expect(refusals).to eq([])
  end

  it "admin: Admin lists and changes locks, limiters and parked jobs, and so does exe/lock_manager; Redis " \
     "refuses nothing" do
    l = locker(user)
    held = written_to_list(l, parked: %w[p1 p2])
    waiter = Thread.new { l.blocking_lock("held", timeout: 5, wait: 3) { :waited } }
    eventually { admin.keys("lock_manager:*:queue:lock:held").any? }
    stuck = l.try_lock("stuck", timeout: 30)
    a = LockManager::Admin.new(l)

    listed = [a.locks.map { |lock| [lock.key, lock.holders.size, lock.waiters.size, lock.parked] },
              a.limiters.map { |limiter| [limiter.name, limiter.used] }, a.parked("job").map(&:jid)]
    changed = [a.delete_parked("job", "p2"), a.reset_limiter("w"), a.release("job"), a.release("held")]
    cli = run_cli(user, "release", "--yes", "stuck")

    expect(listed).to eq([[["held", 1, 1, 0], ["job", 1, 0, 2], ["stuck", 1, 0, 0]], [["sw", 1], ["w", 1]], %w[p1 p2]])
    expect(changed).to eq([true, true, true, true])
    expect(waiter.value).to eq(:waited) # the force-release handed it the lock
    expect(admin.get("lock:job")).to eq("p1") # and the other the first parked job
    expect(cli.last.exitstatus).to eq(0), cli.inspect
    expect([held.owned?, stuck.owned?]).to eq([false, false])
    expect(refusals).to eq([])
  end

  it "read-only: Admin and exe/lock_manager list locks, limiters and parked jobs; every change, and every " \
     "lock, is refused with PermissionError" do
    writer = locker(user)
    held = written_to_list(writer, parked: %w[p1])
    writer.adopt("sem", "holder", timeout: 30, limit: 2)
    reader = acl_user(admin, *rule(:readonly), name: AclRules.user(:readonly), password: password)
    a = LockManager::Admin.new(locker(reader))
    before = admin.keys("*").sort.to_h { |key| [key, admin.dump(key)] }

    listed = [a.locks.map { |lock| [lock.key, lock.holders.size, lock.parked] }, a.lock("held").holders.first.token,
              a.keys, a.limiters.map(&:name), a.parked("job").map(&:jid)]
    cli = run_cli(reader, "list")
    changes = {
      "release" => -> { a.release("held") }, "reset_limiter" => -> { a.reset_limiter("w") },
      "delete_parked" => -> { a.delete_parked("job", "p1") },
      "release_job" => -> { a.release_job(UniqueJobs::UntilExecutedJob, [1, 0]) },
      "try_lock" => -> { locker(reader).try_lock("other") },
      "nonblocking_lock" => -> { locker(reader).nonblocking_lock("other") {} }
    }.transform_values { |call| outcome_and_time(&call) }

    expect(listed).to eq([[["held", 1, 0], ["job", 1, 1], ["sem", 1, 0]], held.token, %w[held job sem], %w[sw w],
                          ["p1"]])
    expect([cli[0], cli[2].exitstatus]).to match([include("held", "job"), 0])
    changes.each do |name, (error, took)|
      expect(error).to be_a(LockManager::PermissionError), "#{name}: #{error.inspect}"
      expect(took).to be < 0.5, name
    end
    expect(admin.keys("*").sort.to_h { |key| [key, admin.dump(key)] }).to eq(before)
  end

  it "a redis_url naming another database, without +select: PermissionError naming 'select', at once" do
    url = acl_user(admin, *rule(:core), name: "lock_manager", password: password).sub(%r{/0\z}, "/1")
    error, took = outcome_and_time { locker(url).blocking_lock("k", wait: 2) { :ran } }
    expect(error).to be_a(LockManager::PermissionError)
    expect(error.message).to include("'select'", "lock \"k\"")
    expect(took).to be < 0.5
  end

  describe "a user missing one part of the core rule" do
    # The parts that carry wake-ups only: a release still hands the lock on, a waiter still gets it.
    wake_ups = %w[&lock_manager:lock:* &lock_manager:process:* +psubscribe +subscribe +publish]

    before { capture_log } # a block's release refused is logged

    AclRules.rule(:core, password: "pw").each do |part|
      next if %w[reset on resetchannels >pw].include?(part)

      told = wake_ups.include?(part) ? "every call works, waits are woken all the same" : "PermissionError at once"
      it "without #{part}: #{told}, and ACL LOG names what Redis refused" do
        url = acl_user(admin, *(rule(:core) - [part]), name: "lock_manager", password: password)
        calls = core_calls(url)
        report(part: part, **calls.transform_values { |outcome, took| "#{outcome.inspect[0, 300]} #{took.round(3)}" })
        errors = calls.select { |_, (outcome, _)| outcome.is_a?(Exception) }

        errors.each do |name, (error, took)|
          expect(error).to be_a(LockManager::PermissionError), "#{name}: #{error.inspect}"
          expect(error.message).to match(/\A(lock|limiter) "\w+": the Redis user of redis_url may not lock here/), name
          # What was refused, as Redis names it ('set', 'lock:k'), or, where it names nothing (Redis 7.0 in a
          # script, or a key), where to look.
          expect(error.message).to match(/'[\w:|]+'|ACL LOG names what it refused/), name
          # A command refused, whether sent by the gem or by a script (the script's line is quoted), is named.
          expect(error.message.downcase).to include("'#{part.delete_prefix("+")}'"), name if part.start_with?("+")
          expect(took).to be < 0.5, "#{name} took #{took}"
        end
        refused = refusals.map { |reason, _, object, _| [reason, object] }
        if wake_ups.include?(part)
          expect(errors).to eq({})
        else
          expect(errors).not_to be_empty
        end
        expect(refused).to include(refused_object(part))
      end
    end

    # What ACL LOG names for the refusal of `part`: [reason, object].
    def refused_object(part)
      case part
      when /\A~(.*)\*\z/ then ["key", start_with(Regexp.last_match(1))]
      when /\A&(.*)\*\z/ then ["channel", start_with(Regexp.last_match(1))]
      else ["command", part.delete_prefix("+")]
      end
    end
  end
end
