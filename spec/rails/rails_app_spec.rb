# frozen_string_literal: true

require "spec_helper"
require_relative "../support/rails_app_server"

# A real Rails app (spec/support/rails_app: ActionController, ActiveRecord on SQLite, the Railtie) on the
# stack's Rails (6.1, 7.2, or 8.1 with RAILS=8.1.3), served by a real Puma, talked to over HTTP. Rails is loaded
# only in the app's processes.
RSpec.describe "a Rails app", :rails do
  # Requests sent at once, each on its own thread and connection.
  def concurrently(count, &block)
    Array.new(count) { |i| Thread.new { block.call(i) } }.map(&:value)
  end

  # The spec's own Locker on the app's keys: a holder in another process, as far as the app can tell.
  def holder(prefix)
    LockManager::Locker.new(redis_url: redis_url, key_prefix: prefix)
  end

  describe "booting (config.lock_manager, the logger, rescue_responses)" do
    let(:boot_env) { { "REDIS_URL" => redis_url, "LOCK_PREFIX" => prefix } }

    it "applies config.lock_manager, logs to Rails.logger tagged [lock_manager], sends events to " \
       "ActiveSupport::Notifications" do
      out, err, status = RailsAppServer.boot(env: boot_env.merge("ON_REDIS_ERROR" => "skip"), code: <<~RUBY)
        LockManager.logger.warn("from the app")
        events = []
        ActiveSupport::Notifications.subscribe(/\\.lock_manager\\z/) { |event| events << [event.name, event.payload[:key]] }
        LockManager::Locker.nonblocking_lock("evented") { nil }
        puts JSON.generate(config: LockManager.config.to_h, log: File.read(ENV["RAILS_LOG_PATH"]), events: events,
                           rescue: ActionDispatch::ExceptionWrapper.rescue_responses.select { |k, _| k.start_with?("LockManager::") })
      RUBY
      expect(status).to be_success, err
      facts = JSON.parse(out)
      expect(facts["events"]).to eq([%w[acquire.lock_manager evented], %w[release.lock_manager evented]])
      expect(facts["config"]).to include("key_prefix" => prefix, "on_redis_error" => "skip", "read_timeout" => 0.5,
                                         "pool_size" => 16, "redis_url" => redis_url)
      expect(facts["log"]).to include("[lock_manager] from the app\n")
      expect(facts["rescue"]).to include(
        "LockManager::LockNotAcquired" => "conflict", "LockManager::ConnectionError" => "service_unavailable",
        "LockManager::TimeoutError" => "service_unavailable", "LockManager::ReadOnlyError" => "service_unavailable",
        "LockManager::PoolTimeout" => "service_unavailable", "LockManager::NotReplicated" => "service_unavailable"
      )
      expect(facts["rescue"].keys).not_to include("LockManager::AuthenticationError", "LockManager::LockLost")
    end

    it "keeps a logger the app set in config.lock_manager.logger" do
      Dir.mktmpdir do |dir|
        own = File.join(dir, "own.log")
        out, err, status = RailsAppServer.boot(env: boot_env.merge("LOCK_MANAGER_LOG_PATH" => own), code: <<~RUBY)
          LockManager.logger.warn("to the app's own logger")
          print File.read(ENV["RAILS_LOG_PATH"])
        RUBY
        expect(status).to be_success, err
        expect(File.read(own)).to include("to the app's own logger")
        expect(out).not_to include("to the app's own logger")
      end
    end

    it "fails the boot with the ArgumentError naming an unknown or bad setting" do
      { { "pool_sise" => 5 } => "unknown option: pool_sise (config.lock_manager)",
        { "pool_size" => 0 } => "pool_size must be an Integer from 1 to 65535, got 0",
        { "on_redis_error" => "run" } => 'on_redis_error must be :raise, :run or :skip, got "run"' }
        .each do |settings, message|
          _, err, status = RailsAppServer.boot(env: boot_env.merge("LOCK_MANAGER_EXTRA" => JSON.generate(settings)))
          expect(status).not_to be_success
          expect(err).to include("ArgumentError").and include(message)
        end
    end
  end

  describe "served by Puma (2 workers forked from a --preload master that locked at boot, 16 threads each)" do
    # One app for the group: booted once, not per example.
    before(:context) do
      @prefix = "spec:rails:#{SecureRandom.hex(4)}:"
      @app = RailsAppServer.new(redis_url: ENV.fetch("REDIS_URL"), prefix: @prefix, workers: 2).start
    end

    after(:context) { @app&.shutdown }

    let(:app) { @app }
    let(:app_prefix) { @prefix }

    it "answers a request that waits (blocking_lock) once another holder releases" do
      lock = holder(app_prefix).try_lock("report", timeout: 10)
      started = monotonic # before the thread, which may start after the sleep below has begun
      waiting = Thread.new { [*app.post("/locks/wait", key: "report", wait: 5), monotonic] }
      sleep 0.5
      lock.release
      status, body, answered = waiting.value
      expect(status).to eq(200)
      expect(answered - started).to be_between(0.5, 3)
      expect(body["fencing_token"]).to be > lock.fencing_token
    end

    it "answers 409 Conflict when the wait runs out (LockNotAcquired, through rescue_responses)" do
      lock = holder(app_prefix).try_lock("report", timeout: 10)
      status = nil
      took = elapsed { status, = app.post("/locks/wait", key: "report", wait: 0.3) }
      expect(status).to eq(409)
      expect(took).to be_between(0.3, 2)
    ensure
      lock&.release
    end

    it "takes with_semaphore_lock's lock under config.lock_manager.key_prefix, and skips while it is held" do
      first = Thread.new { app.post("/locks/try", key: "k", hold: 1) }
      eventually { redis.exists?("#{app_prefix}semaphore_lock:k") }
      expect(holder(app_prefix).try_lock("semaphore_lock:k")).to be_nil # the same key, seen from outside
      expect(app.post("/locks/try", key: "k")).to match([409, include("status" => "skipped", "fencing_token" => nil)])
      status, body = first.value
      expect([status, body["status"]]).to eq([200, "locked"])
      expect(redis.exists?("#{app_prefix}semaphore_lock:k")).to be(false)
    end

    it "logs a lost lock to the Rails log, tagged [lock_manager]" do
      expect(app.post("/locks/try", key: "short", ttl: 0.2, hold: 0.5).first).to eq(200)
      expect(app.rails_log).to match(/^\[lock_manager\] lock "semaphore_lock:short" was lost while its block ran/)
    end

    it "serializes a model's with_semaphore_lock around ActiveRecord's own with_lock (not shadowed)" do
      _, counter = app.post("/counters")
      bumps = concurrently(20) { app.post("/counters/#{counter["id"]}/bump") }
      expect(bumps.map(&:first).uniq).to eq([200]), -> { "#{bumps.inspect}\n#{app.rails_log.lines.last(60).join}" }
      _, shown = app.get("/counters/#{counter["id"]}")
      expect(shown["with_lock"]).to eq("ActiveRecord::Locking::Pessimistic")
      # Every bump reloaded (with_lock) the value the previous holder committed: no update lost.
      expect(shown["value"]).to eq(20)
      tokens = bumps.map { |_, body| body["fencing_token"] }
      expect(tokens.uniq.size).to eq(20)
      expect(shown["fencing_token"]).to eq(tokens.max)
    end

    it "with release: :after_commit, 40 concurrent 'create unless it exists' make exactly one row, and no 500" do
      responses = concurrently(40) { app.post("/bookings", slot: "s1", release: "after_commit", work: 0.05) }
      statuses = responses.map(&:first)
      expect(statuses.tally).to eq(201 => 1, 200 => 39)
      expect(responses.map { |_, body| body["id"] }.uniq.size).to eq(1)
      expect(app.get("/bookings?slot=s1")).to eq([200, { "count" => 1 }])
      expect(responses.map { |_, body| body["pid"] }.uniq.size).to eq(2) # both workers locked
    end

    it "with release: :after_commit, keeps the lock past the block until the transaction ends, here a rollback" do
      key = "#{app_prefix}semaphore_lock:booking:s3"
      request = Thread.new { app.post("/bookings", slot: "s3", work: 2, rollback: 1) }
      eventually { redis.exists?(key) }
      sleep 0.3 # the block (find_by, create!) is long over: the transaction is in its `work`
      expect(redis.exists?(key)).to be(true)
      expect(request.value.first).to eq(422)
      expect(redis.exists?(key)).to be(false)
      expect(app.get("/bookings?slot=s3")).to eq([200, { "count" => 0 }])
    end

    it "with release: :after_block, a request that comes while the first one is still committing reads the slot free" do
      key = "#{app_prefix}semaphore_lock:booking:s2"
      acquisitions = -> { redis.get(fencing_counter_key(key)) }
      before = acquisitions.call
      first = Thread.new { app.post("/bookings", slot: "s2", release: "after_block", work: 2) }
      # The first request took the lock and released it: its block is over, its transaction (2 s more) is not.
      eventually { acquisitions.call != before && !redis.exists?(key) }
      released = acquisitions.call
      second = Thread.new { app.post("/bookings", slot: "s2", release: "after_block") }
      # The second request takes the lock at once, while the first one's transaction is still open.
      eventually { acquisitions.call != released }
      expect(first).to be_alive
      expect(first.value.first).to eq(201)
      if RailsAppServer.rails_version >= Gem::Version.new("8.0")
        # Rails 8 begins SQLite transactions IMMEDIATE: the database itself made the second request wait (holding
        # the lock) for the first one's commit, then it read the booking. PostgreSQL and MySQL do not wait so.
        expect(second.value.first).to eq(200)
      else
        # It read the slot as free and inserted: on PostgreSQL or MySQL (READ COMMITTED) a second booking; SQLite
        # refuses the write of a transaction that read before the other committed: a 500 instead.
        expect(second.value.first).to eq(500)
        expect(app.rails_log).to include("SQLite3::BusyException: database is locked")
      end
      expect(app.get("/bookings?slot=s2")).to eq([200, { "count" => 1 }])
    end
  end

  describe "when Redis cannot be reached" do
    # One Redis and one app per setting, not per example.
    def self.serving(on_redis_error)
      before(:context) do
        @redis_server = RedisServer.new.start
        @app = RailsAppServer.new(redis_url: @redis_server.url, prefix: "app:", on_redis_error: on_redis_error).start
      end

      after(:context) do
        @app&.shutdown
        @redis_server&.shutdown
      end

      let(:app) { @app }
      let(:redis_server) { @redis_server }

      after { redis_server.restart } # up again for the next example (stop does nothing to a stopped one)
    end

    context "with on_redis_error: :raise (the default)" do
      serving(:raise)

      it "answers 503 Service Unavailable while it is down (ConnectionError) or stalled (TimeoutError)" do
        expect(app.post("/locks/try", key: "k").first).to eq(200)
        redis_server.stop
        expect(app.post("/locks/try", key: "k").first).to eq(503)
        expect(app.post("/bookings", slot: "s", wait: 0.3).first).to eq(503) # release: :after_commit
        redis_server.start
        expect(app.post("/locks/try", key: "k").first).to eq(200)

        redis_server.pause
        status = nil
        took = elapsed { status, = app.post("/locks/try", key: "k") }
        redis_server.resume
        expect(status).to eq(503)
        expect(took).to be < 3 # read_timeout is 0.5 s
        expect(app.rails_log).to include("LockManager::TimeoutError")
      end
    end

    context "with on_redis_error: :run" do
      serving(:run)

      it "runs the block unlocked, with a warning in the Rails log tagged [lock_manager]" do
        redis_server.stop
        expect(app.post("/locks/try", key: "k")).to match([200, include("status" => "locked", "fencing_token" => nil)])
        expect(app.rails_log).to match(/^\[lock_manager\] .*running without the lock "semaphore_lock:k"/)
      end

      it "runs the block unlocked with release: :after_commit too" do
        redis_server.stop
        expect(app.post("/bookings", slot: "s", wait: 0.3)).to match([201, include("created" => true)])
      end
    end

    context "with on_redis_error: :skip" do
      serving(:skip)

      it "takes the 'taken' path, with a warning in the Rails log tagged [lock_manager]" do
        redis_server.stop
        expect(app.post("/locks/try", key: "k")).to match([409, include("status" => "skipped")])
        expect(app.rails_log).to match(/^\[lock_manager\] .*treating "semaphore_lock:k" as taken/)
      end

      it "takes the 'taken' path with release: :after_commit too" do
        redis_server.stop
        expect(app.post("/bookings", slot: "s", wait: 0.3).first).to eq(409)
      end
    end
  end
end
