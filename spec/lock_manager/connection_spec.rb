# frozen_string_literal: true

require "spec_helper"

# Each example here owns a private redis-server, so it can stop, pause or restart it.
RSpec.describe "Connections and the pool" do
  let(:server) { RedisServer.new.start }
  let(:admin) { server.client }

  after do
    server.resume if server.port && @paused
    admin.close
    server.shutdown
  end

  def locker(**options)
    tls = server.authority ? server.tls_settings : {}
    LockManager::Locker.new(redis_url: server.url, key_prefix: prefix, **tls, **options)
  end

  def pause_server
    @paused = true
    server.pause
  end

  def gem_client_ids
    admin.client(:list).reject { |c| c["cmd"] == "client|list" }.map { |c| c["id"] }
  end

  def command_calls(name)
    admin.info("commandstats").dig(name, "calls").to_i
  end

  it "connects lazily: a new Locker opens no connection" do
    clients_before = admin.client(:list).size
    l = locker
    expect(l.pool_state).to eq([0, 0])
    expect(admin.client(:list).size).to eq(clients_before)
    l.locked?("k")
    expect(l.pool_state).to eq([1, 1])
  end

  it "opens one connection for a caller that waits on a Redis slow to answer, not one per 10 ms it waits" do
    l = locker(pool_size: 4, connect_timeout: 5)
    before = gem_client_ids
    pause_server # accepts connections, answers no handshake
    caller = Thread.new { l.locked?("k") }
    sleep 0.3
    server.resume
    @paused = false

    expect(caller.value).to be(false)
    expect(l.pool_state).to eq([1, 1])
    expect(gem_client_ids - before).to have_attributes(size: 1)
  end

  it "shares its connector threads between all Lockers of the process" do
    threads = -> { Dir.children("/proc/self/task").size }
    locker.locked?("k") # the process's connector threads exist from here on
    before = threads.call
    lockers = Array.new(10) { locker }
    lockers.each { |l| l.locked?("k") }
    expect(threads.call).to be <= before # finished threads of earlier examples may still exit meanwhile
  end

  it "costs two round trips per lock cycle: SET NX PX + INCR (no script), then one EVALSHA; no PING or SCRIPT LOAD" do
    l = locker(pool_size: 2)
    # The first acquire of a Locker is a script, and the first in a hash slot seeds its fencing
    # counter (docs/design.md): a cycle on the same key comes first.
    l.nonblocking_lock("k") {}
    admin.config("resetstat")
    50.times { l.nonblocking_lock("k") {} }
    # Inside the release script too: it reads the clock only when someone is queued.
    expect(%w[set incr evalsha ping eval script time config].to_h { |name| [name, command_calls(name)] })
      .to eq("set" => 50, "incr" => 50, "evalsha" => 50, "ping" => 0, "eval" => 0, "script" => 0, "time" => 0,
             "config" => 0)
  end

  it "falls back to EVAL when Redis lost its script cache" do
    l = locker
    lock = l.try_lock("k")
    admin.script(:flush)
    expect(lock.release).to be(true)
    expect(l.locked?("k")).to be(false)
  end

  it "returns every connection to the pool after many cycles" do
    l = locker(pool_size: 3)
    Array.new(3) { |i| Thread.new { 200.times { l.nonblocking_lock("k#{i}") {} } } }.each(&:join)
    open, idle = l.pool_state
    expect(open).to be_between(1, 3)
    expect(idle).to eq(open)
  end

  # The same over plain TCP and over TLS: a TLS connection is replaced, and reports a dead or silent
  # Redis, within the same bounds.
  shared_examples "a pool that survives Redis" do
    it "raises ConnectionError naming the key and host:port within about connect_timeout when Redis is down" do
      l = locker(connect_timeout: 0.5)
      l.locked?("k")
      server.stop
      error, took = timed_error(LockManager::ConnectionError) { l.nonblocking_lock("MyWorker") {} }

      expect(error.message).to include('"MyWorker"', "127.0.0.1:#{server.port}")
      expect(took).to be < 1.5
      # a second call, while Redis stays down, fails as fast
      expect { l.locked?("k") }.to raise_error(LockManager::ConnectionError)
      expect(elapsed { l.locked?("k") rescue nil }).to be < 1.5 # rubocop:disable Style/RescueModifier
    end

    it "works again, with the same Locker, once Redis is back (stale pooled connections are replaced)" do
      l = locker(pool_size: 3)
      Array.new(3) { |i| Thread.new { 50.times { l.nonblocking_lock("k#{i}") { sleep 0.001 } } } }.each(&:join)
      expect(l.pool_state.first).to be >= 2

      server.restart
      expect(l.nonblocking_lock("k") { :back }.result).to eq(:back)
      expect(l.try_lock("other")).to be_a(LockManager::Lock)
    end

    it "recovers after Redis was down for a while" do
      # A stopped Redis refuses a connect at once; connect_timeout bounds the TLS handshake of the first
      # call, which took longer than 0.2 s on a loaded run.
      l = locker(connect_timeout: 1, pool_timeout: 1)
      l.locked?("k")
      server.stop
      3.times { expect { l.locked?("k") }.to raise_error(LockManager::ConnectionError) }
      server.start
      expect(eventually(timeout: 5) { l.nonblocking_lock("k") { :back }.result rescue nil }).to eq(:back) # rubocop:disable Style/RescueModifier
    end

    it "retries an acquire once after a connection reset, with the same token" do
      l = locker
      l.locked?("k")
      admin.client(:kill, "type", "normal", "skipme", "yes")
      lock = l.try_lock("k", timeout: 30)
      expect(lock).to be_a(LockManager::Lock)
      expect(admin.get("#{prefix}k")).to eq(lock.token)
    end

    it "raises ConnectionError within about read_timeout when Redis stops answering, and drops that connection" do
      l = locker(read_timeout: 0.3, connect_timeout: 0.3)
      holder = l.try_lock("k", timeout: 30)
      expect(l.pool_state).to eq([1, 1])
      timed_out_id = gem_client_ids.first
      pause_server
      error, took = timed_error(LockManager::ConnectionError) { l.locked?("k") }
      server.resume

      expect(error.message).to include("127.0.0.1:#{server.port}").and match(/read_timeout|connect_timeout/)
      expect(took).to be_between(0.25, 1.5)
      eventually { !admin.client(:list).map { |c| c["id"] }.include?(timed_out_id) }
      # Later callers read their own replies, never the late one of the timed-out call.
      expect(l.locked?("other")).to be(false)
      expect(l.locked?("k")).to be(true)
      expect(holder.owned?).to be(true)
    end

    it "gives up within about read_timeout, or at an interrupt, while other Ruby threads run (Ruby signals readers)" do
      # read_timeout well past the Timeout's 0.2 s: Timeout's thread needs the GVL (the spinner's) to raise,
      # and a loaded run, with read_timeout 0.3, saw the read give up first over TLS.
      l = locker(read_timeout: 0.6, connect_timeout: 0.3)
      l.locked?("k")
      spinning = true
      spinner = Thread.new { nil while spinning } # threads sharing the GVL: Ruby's timer signals every 100 ms
      pause_server
      # An interrupt of a read on a pooled connection: at once over TCP; over TLS once the read gives up.
      interrupted = elapsed { expect { Timeout.timeout(0.2) { l.locked?("k") } }.to raise_error(Timeout::Error) }
      expect(interrupted).to be < 1.2

      # A TimeoutError within the bound, never a hang (a connect begun after the interrupt may end it sooner).
      error, took = timed_error(LockManager::TimeoutError) { l.locked?("k") }
      expect(error.message).to match(/read_timeout|connect_timeout/)
      expect(took).to be < 1.5
    ensure
      spinning = false
      spinner&.join
    end
  end

  it_behaves_like "a pool that survives Redis"

  context "over TLS, a client certificate required (Redis's default)" do
    let(:server) { RedisServer.new(tls: true).start }

    it_behaves_like "a pool that survives Redis"
  end

  it "raises PoolTimeout when every connection stays busy for pool_timeout" do
    l = locker(pool_size: 1, pool_timeout: 0.3, read_timeout: 3)
    l.locked?("k")
    pause_server
    busy = Thread.new { l.locked?("k") rescue $ERROR_INFO } # rubocop:disable Style/RescueModifier
    sleep 0.1
    error, took = timed_error(LockManager::PoolTimeout) { l.locked?("k") }
    server.resume
    busy.join

    expect(error.message).to include("pool_size", "1 pooled")
    expect(took).to be_between(0.25, 1.5)
    expect(error).to be_a(LockManager::Error)
  end

  it "reports a wrong password as AuthenticationError, at once, without repeating it" do
    secured = RedisServer.new(password: "right-one").start
    l = LockManager::Locker.new(redis_url: secured.url(password: "wrong-one"))
    error, took = timed_error(LockManager::AuthenticationError) { l.locked?("k") }
    expect(error.message).to include("credentials").and include("127.0.0.1:#{secured.port}")
    expect(error.message).not_to include("wrong-one")
    expect(error.message).not_to include("right-one")
    expect(took).to be < 0.5
  ensure
    secured&.shutdown
  end

  it "talks to Redis over a unix socket" do
    unix = RedisServer.new(unix: true).start
    l = LockManager::Locker.new(redis_url: "unix://#{unix.socket}")
    expect(l.nonblocking_lock("k") { :unix }.result).to eq(:unix)
  ensure
    unix&.shutdown
  end
end
