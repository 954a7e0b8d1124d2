# frozen_string_literal: true

require "pp" # rubocop:disable Lint/RedundantRequireStatement -- for #pretty_inspect, not only Kernel#pp
require "spec_helper"
require_relative "../support/acl_rules"
require_relative "../support/process_helpers"

# Redis refuses or surprises: its script cache flushed, out of memory, ACL users without rights, wrong
# passwords, keys no one expects, and the password itself, which must never be shown. Each example
# owns a private redis-server (it changes its configuration or needs a password). Each checks that
# nothing was lost, that nothing waited past its bound (generous: the suite runs on a busy 2-core
# machine), and that no other holder's lock was touched.
RSpec.describe "Refusals" do
  include AclUsers
  include ProcessHelpers

  let(:server) { private_server }

  after do
    @admin&.close
    stop_all
  end

  # A plain client of the private server, to look at what the gem wrote.
  def admin
    @admin ||= server.client
  end

  def locker(url: server.url, **options)
    LockManager::Locker.new(redis_url: url, key_prefix: prefix, **options)
  end

  def full(key)
    "#{prefix}#{key}".b
  end

  def command_calls(name)
    admin.info("commandstats").dig(name, "calls").to_i
  end

  # The next message published on a channel matching `pattern`: [channel, message], as bytes.
  def next_publication(pattern)
    ready = Queue.new
    thread = Thread.new do
      client = server.client
      got = nil
      client.psubscribe_with_timeout(5, pattern) do |on|
        on.psubscribe { ready << true }
        on.pmessage do |_, channel, message|
          got = [channel.b, message.b]
          client.punsubscribe
        end
      end
      got
    ensure
      client&.close
    end
    ready.pop
    thread
  end

  # @return [Array(Object, Float)] what the block returned or raised, and how long it took
  def outcome_and_time
    started = monotonic
    outcome = begin
      yield
    rescue StandardError => e
      e
    end
    [outcome, monotonic - started]
  end

  describe "SCRIPT FLUSH (Redis lost its script cache)" do
    it "between every call, and between acquire and release: every form still works (EVAL fallback)" do
      l = locker(pool_size: 4)
      flush = -> { admin.script(:flush) }
      outcomes = []
      flush.call
      outcomes << l.nonblocking_lock("k") { :nonblocking }.result
      flush.call
      outcomes << l.blocking_lock("k", timeout: 2) { :blocking }
      flush.call
      outcomes << l.blocking_lock("k", timeout: 2, fair: true) { :fair }
      flush.call
      outcomes << l.nonblocking_lock("sem", limit: 2) { :semaphore }.result
      flush.call
      outcomes << l.blocking_lock("sem", limit: 2, timeout: 2) { :blocking_semaphore }
      inside = l.nonblocking_lock("k") do # flushed between acquire and release
        flush.call
        :inside
      end
      outcomes << [inside.result, inside.lost?]
      flush.call
      lock = l.try_lock("handle", timeout: 5)
      flush.call
      outcomes << lock.refresh(10)
      flush.call
      outcomes << lock.owned?
      flush.call
      outcomes << lock.release
      flush.call
      waited = l.lock("handle", timeout: 2)
      flush.call
      outcomes << waited.release

      expect(outcomes).to eq([:nonblocking, :blocking, :fair, :semaphore, :blocking_semaphore, [:inside, false],
                              true, true, true, true])
      expect(command_calls("eval")).to be >= 10 # the fallback did run, once per flush
      expect(held_keys(admin, "*")).to eq([])
    end

    it "while a waiter is queued and a renewed lock is held: the waiter is handed the lock, the renewal goes on" do
      l = locker(pool_size: 4)
      holder = l.try_lock("k", timeout: 30)
      renewed = l.try_lock("renewed", timeout: 0.3, renew: true)
      waiter = Thread.new { l.blocking_lock("k", timeout: 10) { |r| [r.fencing_token, monotonic] } }
      eventually { admin.zcard(queue_key(full("k"))) == 1 }
      3.times do # across several renewals (every 0.1 s) and queue heartbeats
        admin.script(:flush)
        sleep 0.3
      end
      admin.script(:flush)
      released_at = monotonic
      expect(holder.release).to be(true)
      fencing_token, got_at = waiter.value

      expect(got_at - released_at).to be < 0.5
      expect(fencing_token).to be > holder.fencing_token
      expect([renewed.owned?, renewed.lost?]).to eq([true, false])
      expect(renewed.release).to be(true)
      expect(held_keys(admin, "*")).to eq([])
    end
  end

  describe "out of memory (maxmemory 1, noeviction)" do
    def out_of_memory!
      admin.config(:set, "maxmemory-policy", "noeviction")
      admin.config(:set, "maxmemory", "1")
    end

    it "refuses every acquire at once with OutOfMemoryError naming the key; locks taken before still " \
       "refresh, renew and release, and nothing is logged" do
      log = StringIO.new
      LockManager.configure { |c| c.logger = Logger.new(log) }
      l = locker(pool_size: 6)
      before = l.try_lock("before", timeout: 30)
      renewed = l.try_lock("renewed", timeout: 0.3, renew: true)
      entered = Queue.new
      go = Queue.new
      in_block = Thread.new { l.nonblocking_lock("in-block", timeout: 30) { (entered << 1) && go.pop && :done } }
      entered.pop
      out_of_memory!
      attempts = {
        "nonblocking_lock" => -> { l.nonblocking_lock("new") {} },
        "blocking_lock" => -> { l.blocking_lock("new", timeout: 10) {} },
        "blocking_lock fair" => -> { l.blocking_lock("new", timeout: 10, fair: true) {} },
        "try_lock" => -> { l.try_lock("new") },
        "lock" => -> { l.lock("new", timeout: 10, fair: true) },
        "blocking_lock on a held key" => lambda {
          Thread.new { (Thread.current.report_on_exception = false) || l.blocking_lock("before", timeout: 10) {} }.join
        }
      }
      refused = attempts.transform_values { |call| outcome_and_time(&call) }

      refused.each do |name, (error, took)|
        expect(error).to be_a(LockManager::OutOfMemoryError), "#{name}: #{error.inspect}"
        expect(error.message).to match(/\Alock "(new|before)": .*out of memory/)
        # A waiter finds out on its next attempt (it sleeps 0.5 s at most between two).
        expect(took).to be < (name.include?("held") ? 1.2 : 0.5), "#{name} took #{took}"
      end
      sleep 0.5 # renewals under OOM: PEXPIRE is allowed
      expect([renewed.owned?, renewed.lost?]).to eq([true, false])
      expect(before.refresh(30)).to be(true)
      expect(before.release).to be(true)
      go << 1
      expect([in_block.value.result, in_block.value.lost?]).to eq([:done, false])
      expect(renewed.release).to be(true)
      expect(log.string).to eq("") # no release failed
      expect(held_keys(admin, "*")).to eq([])
      admin.config(:set, "maxmemory", "0")
      expect(l.nonblocking_lock("new") { :back }.result).to eq(:back)
    ensure
      admin.config(:set, "maxmemory", "0")
    end

    it "refuses a semaphore slot (limit: 2) with OutOfMemoryError too" do
      l = locker
      out_of_memory!
      refused = [-> { l.nonblocking_lock("sem", limit: 2) { :ran } },
                 -> { l.blocking_lock("sem", limit: 2, timeout: 2) { :ran } }].map { |call| outcome_and_time(&call) }

      expect(refused.map(&:first)).to all(be_a(LockManager::OutOfMemoryError))
      expect(refused.map(&:last)).to all(be < 0.5)
      expect(held_keys(admin, "*")).to eq([])
    ensure
      admin.config(:set, "maxmemory", "0")
    end

    it "still releases a lock that has a waiter queued from before the OOM" do
      l = locker(pool_size: 4)
      holder = l.try_lock("k", timeout: 30)
      waiter = Thread.new { outcome_and_time { l.blocking_lock("k", timeout: 2) { :waited } } }
      eventually { admin.zcard(queue_key(full("k"))) == 1 }
      out_of_memory!
      released, took = outcome_and_time { holder.release }
      admin.config(:set, "maxmemory", "0")
      waited, = waiter.value

      aggregate_failures do
        expect(released).to be(true)
        expect(took).to be < 0.5
        expect(admin.get(full("k"))).not_to eq(holder.token) # released, or handed to the waiter
        expect(waited).to eq(:waited).or be_a(LockManager::OutOfMemoryError)
        expect(held_keys(admin, "*")).to eq([])
      end
    ensure
      admin.config(:set, "maxmemory", "0")
    end
  end

  describe "ACL users without the rights the lock needs" do
    # Every call a user makes, with how long each took.
    def calls(user)
      {
        "nonblocking_lock" => -> { user.nonblocking_lock("MyKey") {} },
        "blocking_lock" => -> { user.blocking_lock("MyKey", timeout: 10) {} },
        "blocking_lock fair" => -> { user.blocking_lock("MyKey", timeout: 10, fair: true) {} },
        "limit: 2" => -> { user.nonblocking_lock("MyKey", limit: 2) {} },
        "blocking limit: 2" => -> { user.blocking_lock("MyKey", limit: 2, timeout: 10) {} },
        "try_lock" => -> { user.try_lock("MyKey") },
        "lock" => -> { user.lock("MyKey", timeout: 10) }
      }.transform_values { |call| outcome_and_time(&call) }
    end

    def expect_refused(outcomes, reason)
      outcomes.each do |name, (error, took)|
        expect(error).to be_a(LockManager::PermissionError), "#{name}: #{error.inspect}"
        expect(error.message).to start_with('lock "MyKey": ').and match(reason)
        expect(took).to be < 1.0, "#{name} took #{took}"
      end
    end

    it "a user without rights on the lock's keys (~other:*): PermissionError naming the key, at once, " \
       "nothing written" do
      l = locker(url: acl_user(admin, "~other:*", "+@all"))
      outcomes = calls(l)
      outcomes["locked?"] = outcome_and_time { l.locked?("MyKey") }

      expect_refused(outcomes, /NOPERM|no permissions/i)
      expect(admin.keys("*")).to eq([])
    end

    it "a user who may not run scripts (-@scripting): PermissionError naming the key, at once, nothing written" do
      l = locker(url: acl_user(admin, "~*", "&*", "+@all", "-@scripting"))

      expect_refused(calls(l), /evalsha/i)
      expect(l.locked?("MyKey")).to be(false) # a plain EXISTS is allowed
      expect(admin.keys("*")).to eq([])
    end

    it "a user who may not publish or subscribe (Redis 7's default resetchannels): releases still hand the lock " \
       "on, and a waiter of the releasing process hears it at once" do
      l = locker(url: acl_user(admin, "~*", "+@all"), pool_size: 4, retry_interval: 5)
      holder = l.try_lock("MyKey", timeout: 30)
      waiter = Thread.new { outcome_and_time { l.blocking_lock("MyKey", timeout: 10) { monotonic } } }
      eventually { admin.zcard(queue_key(full("MyKey"))) == 1 }
      sleep 1.5 # no subscription: the waiter is on its backoff, by now pausing 0.5 s and more
      released_at = monotonic
      released, took = outcome_and_time { holder.release } # hands the lock on; the publication is refused
      entered_at, = waiter.value

      expect(released).to be(true)
      expect(took).to be < 0.5
      expect(entered_at - released_at).to be < 0.3 # told by the release's reply, not the backoff
      expect(held_keys(admin, "*")).to eq([])
    end

    it "a user who may not subscribe: after the refusal, waits keep to the backoff without asking again " \
       "for 10 s (one connection for ten waits, not ten)" do
      url = acl_user(admin, "~*", "+@all")
      l = locker(url: url, pool_size: 1)
      holder = locker(url: url, pool_size: 1).try_lock("MyKey", timeout: 30)
      l.locked?("MyKey") # its one pooled connection, before counting
      connections = total_connections(admin)
      errors = Array.new(10) { outcome_and_time { l.blocking_lock("MyKey", timeout: 0.05) {} }.first }

      expect(errors.map(&:class).uniq).to eq([LockManager::LockNotAcquired])
      expect(total_connections(admin) - connections).to eq(1) # the subscriber's one attempt
      expect(holder.release).to be(true)
    end
  end

  describe "where a waiter's process cannot have a channel of its own" do
    # A fair waiter on `waiting` and a holder on `holding`: two Lockers, so two subscribers, as
    # two processes have, and only a publication tells the waiter (its pause is 0.5 s meanwhile).
    # @return [Array(Float, String, Array(String, String))] how long after the release the waiter
    #   entered its block, its entry in the queue's details, and the publication
    def hand_off(holding, waiting, redis_key)
      holder = holding.try_lock("MyKey", timeout: 30)
      waiter = Thread.new { waiting.blocking_lock("MyKey", timeout: 10, fair: true) { monotonic } }
      eventually { admin.zcard(queue_key(redis_key)) == 1 && admin.pubsub(:numpat).positive? }
      sleep 0.1 # the subscriber's re-check is done
      entry = admin.hvals(waiters_key(redis_key)).first
      publication = next_publication("lock_manager:*")
      released_at = monotonic
      expect(holder.release).to be(true)
      [waiter.value - released_at, entry, publication.value]
    end

    it "a user who may listen on the locks' channels only: the hand-off goes out on the lock's channel, " \
       "and the waiter hears it at once" do
      url = acl_user(admin, "~*", "+@all", "resetchannels", "&lock_manager:#{prefix}*")
      heard, entry, publication = hand_off(locker(url: url), locker(url: url), full("MyKey"))

      expect(entry).to match(/\A\d+:\d+:\z/)
      expect(publication[0]).to eq("lock_manager:".b + full("MyKey"))
      expect(heard).to be < 0.3
      expect(held_keys(admin, "*")).to eq([])
    end

    it "a key prefix whose pattern covers the process channels (\"process:\"): the same" do
      lockers = Array.new(2) { LockManager::Locker.new(redis_url: server.url, key_prefix: "process:") }
      heard, entry, publication = hand_off(*lockers, "process:MyKey")

      expect(entry).to match(/\A\d+:\d+:\z/)
      expect(publication[0]).to eq("lock_manager:process:MyKey".b)
      expect(heard).to be < 0.3
      expect(held_keys(admin, "*")).to eq([])
    end
  end

  describe "a wrong password" do
    let(:server) { private_server(password: "the-right-one-3k9") }

    it "raises AuthenticationError at once from every call, never retrying in the call" do
      l = locker(url: server.url(password: "a-wrong-one-7q2"))
      calls = {
        "nonblocking_lock" => -> { l.nonblocking_lock("k") {} },
        "try_lock" => -> { l.try_lock("k") },
        "locked?" => -> { l.locked?("k") },
        "blocking_lock" => -> { l.blocking_lock("k", timeout: 10) {} },
        "blocking_lock fair" => -> { l.blocking_lock("k", timeout: 10, fair: true) {} },
        "lock" => -> { l.lock("k", timeout: 10) }
      }
      calls.each_with_index do |(name, call), i|
        connections = total_connections(admin)
        error, took = outcome_and_time(&call)

        expect(error).to be_a(LockManager::AuthenticationError), "#{name}: #{error.inspect}"
        expect(error).not_to be_a(LockManager::ConnectionError)
        expect(error.message).to include('lock "k"', "127.0.0.1:#{server.port}", "credentials")
        expect(error.message).not_to include("the-right-one", "a-wrong-one")
        expect(took).to be < 1.0, "#{name} took #{took}"
        # One connection attempt per call, no retry loop. Counted until the first blocking call: that
        # one starts the subscriber, whose own attempts are the next example's.
        expect(total_connections(admin) - connections).to be <= 2, name if i < 3
      end
      no_password = locker(url: "redis://127.0.0.1:#{server.port}/0") # NOAUTH
      error, took = outcome_and_time { no_password.try_lock("k") }
      expect(error).to be_a(LockManager::AuthenticationError)
      expect(took).to be < 0.5
      expect(admin.keys("*")).to eq([])
    end

    it "leaves no background loop retrying the wrong password once blocking_lock raised" do
      l = locker(url: server.url(password: "a-wrong-one-7q2"))
      expect { l.blocking_lock("k", timeout: 10) {} }.to raise_error(LockManager::AuthenticationError)
      sleep 0.3
      connections = total_connections(admin)
      sleep 1.5
      attempts = total_connections(admin) - connections

      expect(l).to be_a(LockManager::Locker) # still in use: not collected meanwhile
      expect(attempts).to be <= 1
    end
  end

  describe "keys no one expects" do
    let(:keys) do
      {
        "binary" => "\xFF\x00".b, "NUL" => "a\u0000b", "braces" => "{user}:{1}", "glob *" => "*",
        "glob ?" => "?", "glob []" => "[a-z]", "quotes" => %q("'`), "spaces" => " two  words ",
        "newlines" => "line1\nline2\r\n", "Lua" => "') redis.call('FLUSHALL') --",
        "Lua, long bracket" => "]]; redis.call('DEL', KEYS[1]) --[[", "backslashes" => "\\x00\\\\",
        "UTF-8" => "ключ-🔒", "Symbol" => :"a symbol", "1 MB, every byte value" => (0..255).map(&:chr).join.b * 4096
      }
    end

    it "round-trip untouched: the Redis key is exactly prefix + key, held against a second holder, " \
       "and release deletes exactly it" do
      l = locker
      other = locker
      keys.each do |name, key|
        neighbours = [other.try_lock("#{key}x", timeout: 30), other.try_lock("x#{key}", timeout: 30)]
        expected = [full(key), *neighbours.map { |n| full(n.key) }].sort
        seen = l.nonblocking_lock(key, timeout: 30) do |r|
          { stored: held_keys(admin, "*").map(&:b).sort, value: admin.get(full(key)), fencing: r.fencing_token,
            second: [other.nonblocking_lock(key) { :never }.run?, other.try_lock(key), other.locked?(key)] }
        end.result
        handle = l.try_lock(key, timeout: 30)

        expect(seen[:stored]).to eq(expected), name
        expect(seen[:value]).to match(SpecHelpers::TOKEN), name
        expect(seen[:second]).to eq([false, nil, true]), name
        expect(seen[:fencing]).to be_an(Integer)
        expect([handle.key.b, admin.get(full(key))]).to eq([key.to_s.b, handle.token]), name
        expect(handle.release).to be(true)
        expect(admin.exists?(full(key))).to be(false), name
        neighbours.each { |n| expect(admin.get(full(n.key))).to eq(n.token), name }
        expect(neighbours.map(&:release)).to eq([true, true])
      end
      expect(held_keys(admin, "*")).to eq([])
    end

    it "queue, hand over (by a publication on the waiter's process channel alone, naming the new holder, its " \
       "fencing token and the key) and issue growing fencing tokens with blocking_lock" do
      l = locker(pool_size: 4)
      other = locker
      keys.each do |name, key|
        holder = other.try_lock(key, timeout: 30)
        waiter = Thread.new { l.blocking_lock(key, timeout: 5, fair: true) { |r| [r.fencing_token, monotonic] } }
        # Queued with its process's channel (the first waiter's process subscribes meanwhile).
        eventually { admin.hvals(waiters_key(full(key))).first.to_s.include?(":lock_manager:process:") }
        queued = admin.zrange(queue_key(full(key)), 0, -1).map(&:b)
        expect(admin.hkeys(waiters_key(full(key))).map(&:b)).to eq(queued), name
        publication = next_publication("lock_manager:*")
        released_at = monotonic
        expect(holder.release).to be(true)
        fencing_token, got_at = waiter.value
        channel, message = publication.value

        expect(channel).to match(/\Alock_manager:process:\h{8}-\h{4}-4\h{3}-[89ab]\h{3}-\h{12}\z/n), name
        expect(admin.pubsub(:numsub, channel)).to eq([channel, 1]), name
        expect(message).to eq("#{queued.first} #{fencing_token} ".b + full(key)), name
        expect(got_at - released_at).to be < 1.0, name
        expect(fencing_token).to be > holder.fencing_token
        expect(held_keys(admin, "*")).to eq([]), name
      end
    end
  end

  describe "the password" do
    password = "Pw-7f3c9e-DISTINCT"
    wrong = "Wrong-5d2a1b-GUESS"
    acl_password = "Acl-2b8e4f-SECRET"
    let(:server) { private_server(password: password) }

    # Everything an error shows: its message, its full report without a backtrace, its inspect.
    def shown(error)
      [error.message, error.full_message(highlight: false), error.inspect, error.class.name]
    end

    it "appears in no message, log line or inspect, whatever went wrong" do
      log = StringIO.new
      LockManager.configure do |c|
        c.redis_url = server.url
        c.key_prefix = prefix
        c.logger = Logger.new(log)
      end
      limited = acl_user(admin, "~other:*", "+@all", name: "limited", password: acl_password)
      port = server.port
      errors = [] # what was raised
      texts = [] # and what calls that did not raise returned
      catch_error = lambda do |&call|
        texts << call.call.inspect
      rescue StandardError => e
        errors << e
      end

      # Refusals: a wrong password, none, an ACL user without rights, OOM.
      catch_error.call { locker(url: server.url(password: wrong)).nonblocking_lock("k") {} }
      catch_error.call { locker(url: "redis://127.0.0.1:#{port}/0").try_lock("k") }
      catch_error.call { locker(url: limited).try_lock("k") }
      begin
        admin.config(:set, "maxmemory-policy", "noeviction")
        admin.config(:set, "maxmemory", "1")
        catch_error.call { LockManager::Locker.nonblocking_lock("k") {} }
      ensure
        admin.config(:set, "maxmemory", "0")
      end
      # Timeouts: no reply within read_timeout (CLIENT PAUSE), a pool with no free connection, a
      # release that timed out (logged), a lock held by another.
      slow = locker(read_timeout: 0.2)
      busy = locker(pool_size: 1, pool_timeout: 0.2, read_timeout: 2)
      [slow, busy].each { |l| l.locked?("warm") }
      admin.client(:pause, 700, "ALL")
      stalled = Thread.new { catch_error.call { busy.locked?("k") } }
      sleep 0.05
      catch_error.call { slow.try_lock("k") }
      catch_error.call { busy.locked?("k") }
      stalled.join
      slow.nonblocking_lock("released-late") { admin.client(:pause, 500, "ALL") }
      held = locker.try_lock("held", timeout: 30)
      catch_error.call { locker.blocking_lock("held", timeout: 0.2) {} }
      held.release
      # Nobody listening, with the password in the URL.
      catch_error.call { locker(url: "redis://:#{password}@127.0.0.1:#{FreePort.pick}/0").try_lock("k") }
      # Lost locks: a warning (on_lost: :warn), and LockLost (on_lost: :raise).
      LockManager::Locker.nonblocking_lock("lost", timeout: 0.05) { sleep 0.1 }
      catch_error.call { locker(on_lost: :raise).nonblocking_lock("lost", timeout: 0.05) { sleep 0.1 } }
      # Bad URLs and settings, with the password in them.
      ["http://:#{password}@127.0.0.1:#{port}/0", "redis://:#{password}@127.0.0.1:notaport/0",
       "redis://:#{password}@[::1/0", "redis://u:#{password}@127.0.0.1:99999/0", "unix://:#{password}@/nowhere",
       "redis://:#{password}@"].each do |url|
        catch_error.call { LockManager::Locker.new(redis_url: url) }
        catch_error.call { LockManager.configure { |c| c.redis_url = url }.then { LockManager.locker } }
      end
      catch_error.call { LockManager.configure { |c| c.pool_size = 0 } }
      catch_error.call { LockManager::Locker.new(redis_url: server.url, pool_size: "5") }
      LockManager.configure { |c| c.redis_url = server.url }

      classes = errors.map(&:class).uniq
      expect(classes).to include(LockManager::AuthenticationError, LockManager::PermissionError,
                                 LockManager::OutOfMemoryError, LockManager::TimeoutError, LockManager::PoolTimeout,
                                 LockManager::LockNotAcquired, LockManager::ConnectionError, LockManager::LockLost,
                                 ArgumentError)
      expect(log.string).to include("released-late", "lost")
      shared = LockManager.locker
      texts += errors.flat_map { |e| shown(e) } + [
        log.string, shared.inspect, shared.settings.to_s, shared.pretty_inspect, LockManager.config.inspect,
        LockManager.config.pretty_inspect, LockManager.config.redis_url, LockManager.config.to_h.to_s,
        locker(url: limited).inspect, locker.inspect
      ]
      [password, wrong, acl_password].each do |secret|
        expect(texts.select { |text| text.include?(secret) }).to eq([]), "#{secret} shown"
      end
    end

    it "appears nowhere in what a failing process prints (stdout and stderr, the uncaught error included)" do
      child = ruby_child(<<~RUBY, "REDIS_URL" => server.url, "WRONG_URL" => server.url(password: wrong))
        $stdout.sync = true
        require "lock_manager"
        p LockManager.config
        p LockManager.locker
        puts LockManager.config.redis_url
        LockManager::Locker.nonblocking_lock("lost", timeout: 0.05) { sleep 0.1 } # warns on stderr
        puts "done"
        LockManager::Locker.new(redis_url: ENV.fetch("WRONG_URL")).nonblocking_lock("k") {}
      RUBY
      lines = []
      lines << child.gets until lines.last == "done"
      status = child.wait(timeout: 10)
      printed = lines.join("\n")
      stderr = child.stderr

      expect(status.success?).to be(false)
      expect(stderr).to include("LockManager::AuthenticationError", "lost")
      expect(printed).to include("REDACTED")
      [password, wrong].each do |secret|
        expect(printed).not_to include(secret)
        expect(stderr).not_to include(secret)
      end
    end

    it "appears nowhere when it holds URL delimiters ('@' works unencoded, '/' does not parse)" do
      admin.config(:set, "requirepass", "Head@Tail-9c4d")
      url = "redis://:Head@Tail-9c4d@127.0.0.1:#{server.port}/0"
      l = LockManager::Locker.new(redis_url: url)
      expect(l.nonblocking_lock("k") { :in }.result).to eq(:in) # that is the password Redis checks
      LockManager.configure { |c| c.redis_url = url }
      with_at = [l.inspect, l.settings.to_s, LockManager.config.inspect, LockManager.config.redis_url]
      slash = "redis://:Head/Tail-9c4d@127.0.0.1:#{server.port}/0"
      error, = outcome_and_time { LockManager::Locker.new(redis_url: slash) }
      refused, = outcome_and_time { LockManager.configure { |c| c.redis_url = slash } } # parsed at configure
      expect([error, refused]).to all(be_a(ArgumentError))
      with_slash = [error.message, refused.message, LockManager.config.inspect, LockManager.config.redis_url]

      aggregate_failures do
        expect(with_at.select { |text| text.include?("Tail-9c4d") }).to eq([])
        expect(with_slash.select { |text| text.include?("Tail-9c4d") }).to eq([])
      end
    end
  end
end
