# frozen_string_literal: true

require "spec_helper"
require "open3"
require "sidekiq/api"
require "lock_manager/worker"
require "lock_manager/lockable"
require_relative "../support/sidekiq_client"

# The DSL and the middleware in this process; spec/sidekiq/ runs them in a real Sidekiq.
RSpec.describe LockManager::Worker do
  def job_class(name = "TestJob", &body)
    Class.new do
      include LockManager::Worker
      define_singleton_method(:name) { name }
      class_eval(&body) if body
      def perform(*); end
    end
  end

  it "is available after a plain require \"lock_manager\", as Bundler.require does in Rails" do
    script = 'require "lock_manager"; puts [LockManager::Worker, LockManager::Lockable].inspect'
    output, status = Open3.capture2e(RbConfig.ruby, "-I", File.expand_path("../../lib", __dir__), "-e", script)
    expect(status).to be_success, output
    expect(output.strip).to eq("[LockManager::Worker, LockManager::Lockable]")
  end

  describe "lock_with" do
    it "makes the class a Sidekiq job, once" do
      klass = job_class
      expect(klass.ancestors).to include(Sidekiq::Worker)
      already = Class.new do
        include Sidekiq::Worker
        include LockManager::Worker
      end
      expect(already.ancestors.count(Sidekiq::Worker)).to eq(1)
    end

    it "stores JSON-safe options under the Sidekiq option lock_manager, and keeps a Proc key on the class" do
      key = ->(user_id, *) { "user:#{user_id}" }
      klass = job_class { lock_with :nonblocking, key: key, timeout: 12, on_conflict: :reschedule, reschedule_in: 3 }

      expect(klass.get_sidekiq_options["lock_manager"]).to eq(
        "mode" => "nonblocking", "timeout" => 12, "limit" => 1, "on_conflict" => "reschedule", "reschedule_in" => 3
      )
      stored = klass.get_sidekiq_options["lock_manager"]
      expect(JSON.parse(JSON.generate(stored))).to eq(stored)
      expect(klass.lock_manager_key).to equal(key)
      expect(klass.get_sidekiq_options).not_to have_key("lock")
    end

    it "stores max_reschedules and when_exhausted, and keeps a reschedule_in Proc on the class, inherited" do
      backoff = ->(attempt) { attempt * 2 }
      klass = job_class do
        lock_with on_conflict: :reschedule, reschedule_in: backoff, max_reschedules: 3, when_exhausted: :raise
      end

      expect(klass.get_sidekiq_options["lock_manager"]).to eq(
        "mode" => "nonblocking", "timeout" => 30, "limit" => 1, "on_conflict" => "reschedule",
        "max_reschedules" => 3, "when_exhausted" => "raise"
      )
      expect(klass.lock_manager_reschedule_in).to equal(backoff)
      expect(Class.new(klass).lock_manager_reschedule_in).to equal(backoff)
      expect(job_class { lock_with on_conflict: :reschedule, reschedule_in: 2 }.lock_manager_reschedule_in).to be_nil
    end

    it "keeps String keys in the options, and :class as no key at all" do
      expect(job_class { lock_with :blocking, key: "fixed" }.get_sidekiq_options["lock_manager"])
        .to eq("mode" => "blocking", "key" => "fixed", "timeout" => 30, "limit" => 1)
      expect(job_class { lock_with key: :class }.get_sidekiq_options["lock_manager"]).not_to have_key("key")
    end

    it "stores the uniqueness modes with unique_for, their renewal and limit implied" do
      klass = job_class { lock_with :until_executed, unique_for: 3600, timeout: 10 }
      expect(klass.get_sidekiq_options["lock_manager"]).to eq(
        "mode" => "until_executed", "timeout" => 10, "unique_for" => 3600, "on_conflict" => "skip"
      )
      expect(LockManager::JobOptions.new(klass.get_sidekiq_options["lock_manager"]).renew).to be(true)
      expect(job_class { lock_with :until_executing, unique_for: 60 }.get_sidekiq_options["lock_manager"])
        .to eq("mode" => "until_executing", "timeout" => 30, "unique_for" => 60)
    end

    it "is reachable as LockManager::Job too" do
      klass = Class.new { include LockManager::Job }
      expect(klass).to respond_to(:lock_with)
      expect(LockManager::Job).to equal(LockManager::Worker)
    end

    it "is inherited by subclasses, Proc key included" do
      parent = job_class { lock_with key: ->(id) { "p:#{id}" } }
      child = Class.new(parent)
      expect(child.get_sidekiq_options["lock_manager"]["mode"]).to eq("nonblocking")
      expect(child.lock_manager_key.call(3)).to eq("p:3")
    end

    it "keeps what on_conflict: :park needs in the job's options" do
      klass = job_class { lock_with :nonblocking, key: "k", on_conflict: :park, park_limit: 10, when_full: :raise }

      expect(klass.get_sidekiq_options["lock_manager"]).to eq(
        "mode" => "nonblocking", "key" => "k", "timeout" => 30, "limit" => 1, "on_conflict" => "park",
        "park_limit" => 10, "when_full" => "raise"
      )
    end

    {
      [:sometimes, {}] => /mode/,
      [:nonblocking, { key: 42 }] => /key/,
      [:nonblocking, { key: "" }] => /key/,
      [:nonblocking, { key: [] }] => /key/,
      [:nonblocking, { timeout: 0 }] => /timeout/,
      [:nonblocking, { timeout: "30" }] => /timeout/,
      [:nonblocking, { timeout: Float::INFINITY }] => /timeout/,
      [:nonblocking, { on_conflict: :wait }] => /on_conflict/,
      [:blocking, { on_conflict: :skip }] => /on_conflict/,
      [:nonblocking, { reschedule_in: -1 }] => /reschedule_in/,
      [:nonblocking, { max_reschedules: 3 }] => /max_reschedules is for on_conflict: :reschedule/,
      [:nonblocking, { on_conflict: :reschedule, max_reschedules: -1 }] => /max_reschedules/,
      [:nonblocking, { on_conflict: :reschedule, when_exhausted: :raise }] => /when_exhausted needs max_reschedules/,
      [:nonblocking, { limit: 0 }] => /limit/,
      [:nonblocking, { limit: 2.5 }] => /limit/,
      [:nonblocking, { ttl: 5 }] => /ttl/,
      [:nonblocking, { renew: "yes" }] => /renew/,
      [:nonblocking, { max_hold: 60 }] => /max_hold needs renew/,
      [:blocking, { renew: true, max_hold: 0 }] => /max_hold/,
      [:until_executed, {}] => /needs unique_for/,
      [:until_executing, { unique_for: 0 }] => /unique_for/,
      [:until_executed, { unique_for: 60, limit: 2 }] => /limit is not for it/,
      [:until_executed, { unique_for: 60, renew: false }] => /always renews/,
      [:until_executing, { unique_for: 60, on_conflict: :skip }] => /on_conflict is not for :until_executing/,
      [:nonblocking, { unique_for: 60 }] => /unique_for is for/,
      [:until_executed, { unique_for: 60, on_conflict: :park }] => /:park is for :nonblocking and/,
      [:until_and_while_executing, { unique_for: 60, on_conflict: :park, limit: 2 }] => /limit is not for it/,
      [:nonblocking, { on_conflict: :park, renew: false }] => /renews the lock/,
      [:nonblocking, { on_conflict: :park, park_limit: 0 }] => /park_limit/,
      [:nonblocking, { on_conflict: :park, when_full: :wait }] => /when_full/,
      [:nonblocking, { park_limit: 5 }] => /park_limit is for on_conflict: :park/,
      [:nonblocking, { on_conflict: :skip, when_full: :skip }] => /when_full is for on_conflict: :park/
    }.each do |(mode, options), message|
      it "raises ArgumentError at class load for #{mode.inspect} #{options.inspect}, naming the option" do
        expect { job_class { lock_with mode, **options } }.to raise_error(ArgumentError, message)
      end
    end
  end

  describe LockManager::Sidekiq::ServerMiddleware do
    let(:middleware) { described_class.new }
    let(:log) { StringIO.new }

    before do
      configure_shared_locker!
      Sidekiq.configure_client { |config| config.redis = { url: redis_url } }
      @sidekiq_logger = Sidekiq.logger
      sidekiq_config.logger = Logger.new(log)
    end

    after { sidekiq_config.logger = @sidekiq_logger }

    include SidekiqConfig

    def job_hash(klass, *args, **extra)
      { "class" => klass.name, "jid" => SecureRandom.hex(12), "args" => args, "queue" => "default" }
        .merge(klass.get_sidekiq_options).merge(extra.transform_keys(&:to_s))
    end

    def run(klass, job)
      ran = false
      middleware.call(klass.new, job, "default") { ran = true }
      ran
    end

    it "passes jobs without lock_with through untouched, without reaching Redis" do
      LockManager.configure { |c| c.redis_url = closed_url }
      plain = Class.new do
        include Sidekiq::Worker
        def self.name = "PlainJob"
      end
      expect(run(plain, { "class" => "PlainJob", "args" => [] })).to be(true)
    end

    it "runs the job under a lock on the class name by default" do
      klass = job_class("KeyedByClass") { lock_with :nonblocking }
      seen = nil
      middleware.call(klass.new, job_hash(klass), "default") { seen = redis.exists?("#{prefix}KeyedByClass") }
      expect(seen).to be(true)
      expect(redis.exists?("#{prefix}KeyedByClass")).to be(false)
    end

    it "keys on a Proc over the job's arguments" do
      klass = job_class { lock_with key: ->(user_id, *) { "user:#{user_id}" } }
      seen = nil
      middleware.call(klass.new, job_hash(klass, 42, "x"), "default") { seen = held_keys(redis, "#{prefix}*") }
      expect(seen).to eq(["#{prefix}user:42"])
    end

    it "reschedules a job whose lock is held with its whole payload, a new jid, and no error of its own" do
      klass = job_class("RescheduledCopyJob") { lock_with key: "copied", on_conflict: :reschedule, reschedule_in: 60 }
      elsewhere.try_lock("copied")
      marker = SecureRandom.hex(4)
      job = job_hash(klass, marker, "cattr" => { "tenant" => 7 }, "tags" => ["a"], "bid" => "batch-1",
                                    "retry_count" => 2, "failed_at" => 1_760_000_000.5, "enqueued_at" => 1_760_000_001,
                                    "lock_manager_reschedules" => 2)

      expect(run(klass, job)).to be(false)
      pushed = redis.zrange("schedule", 0, -1).map { |raw| JSON.parse(raw) }.find { |again| again["args"] == [marker] }
      expect(pushed).to include("cattr" => { "tenant" => 7 }, "tags" => ["a"], "bid" => "batch-1", "retry_count" => 2,
                                "failed_at" => 1_760_000_000.5, "lock_manager_reschedules" => 3)
      expect(pushed["jid"]).not_to eq(job["jid"])
      expect(pushed["enqueued_at"]).not_to eq(1_760_000_001)

      # A retry after a failure (its error with it) starts its count again; its copy carries no error,
      # so the copy's own start does not restart the count.
      retried = job.merge("jid" => SecureRandom.hex(12), "args" => [marker * 2], "error_class" => "RuntimeError",
                          "error_message" => "boom")
      expect(run(klass, retried)).to be(false)
      again = redis.zrange("schedule", 0, -1).map { |raw| JSON.parse(raw) }.find { |copy| copy["args"] == [marker * 2] }
      expect(again).to include("lock_manager_reschedules" => 1, "retry_count" => 2)
      expect(again.keys).not_to include("error_class", "error_message")
    ensure
      redis.zrem("schedule", redis.zrange("schedule", 0, -1).grep(/#{marker}/)) if marker
    end

    it "skips a job whose lock is held, logging one line with class, jid and key" do
      klass = job_class("SkipJob") { lock_with key: "busy" }
      elsewhere.try_lock("busy")
      job = job_hash(klass)

      expect(run(klass, job)).to be(false)
      expect(log.string.lines.grep(/lock_manager/).size).to eq(1)
      expect(log.string).to include("SkipJob", job["jid"], '"busy"')
    end

    it "reschedules a job whose lock is held: same arguments, later, with jitter" do
      klass = job_class("LaterJob") { lock_with key: "busy", on_conflict: :reschedule, reschedule_in: 60 }
      elsewhere.try_lock("busy")
      before = Time.now.to_f
      expect(run(klass, job_hash(klass, 1, "two"))).to be(false)

      entry = Sidekiq::ScheduledSet.new.find { |e| e.klass == "LaterJob" }
      expect(entry.args).to eq([1, "two"])
      expect(entry.at.to_f - before).to be_between(60, 75.5)
      entry.delete
    end

    describe "on_conflict: :reschedule's backoff" do
      let(:count) { LockManager::JobBackoff::COUNT }

      def scheduled(klass)
        Sidekiq::ScheduledSet.new.select { |e| e.klass == klass.name }
      end

      after { Sidekiq::ScheduledSet.new.clear }

      it "pushes the job again carrying its count, for the default curve's delay of that attempt" do
        klass = job_class("CurveJob") { lock_with key: "busy", on_conflict: :reschedule }
        elsewhere.try_lock("busy")
        job = job_hash(klass, 1).merge(count => 3)
        before = Time.now.to_f
        expect(run(klass, job)).to be(false)

        entry = scheduled(klass).first
        expect(entry.item).to include("args" => [1], count => 4)
        expect(entry.at.to_f - before).to be_between(8, 10.5) # the 4th: 8 s plus up to 25%
        expect(log.string).to include("rescheduled CurveJob jid=#{job["jid"]} in ",
                                      "(reschedule 4): lock \"busy\" is held")
      end

      it "asks the class's Proc with the attempt (the job's own number overrides it)" do
        seen = []
        klass = job_class("ProcJob") do
          lock_with key: "busy", on_conflict: :reschedule, reschedule_in: ->(attempt) { (seen << attempt).last * 100 }
        end
        elsewhere.try_lock("busy")
        before = Time.now.to_f
        run(klass, job_hash(klass))
        run(klass, job_hash(klass).merge(count => 1))
        run(klass, job_hash(klass, lock_manager: { "reschedule_in" => 1000 }))

        expect(seen).to eq([1, 2])
        expect(scheduled(klass).map { |e| [e.item[count], (e.at.to_f - before).round(-1)] })
          .to contain_exactly([1, 100], [2, 200], [1, be_between(1000, 1250)])
      end

      it "fails the job naming the class and option when the Proc gives no positive seconds" do
        klass = job_class("BadProcJob") { lock_with key: "busy", on_conflict: :reschedule, reschedule_in: ->(_) { 0 } }
        elsewhere.try_lock("busy")
        expect { run(klass, job_hash(klass)) }
          .to raise_error(ArgumentError, /BadProcJob lock_with reschedule_in\(1\) must be a positive number/)
      end

      it "skips a job past max_reschedules, one line naming class, jid, key and count" do
        klass = job_class("ExhaustedJob") { lock_with key: "busy", on_conflict: :reschedule, max_reschedules: 2 }
        elsewhere.try_lock("busy")
        run(klass, job_hash(klass).merge(count => 1))
        job = job_hash(klass).merge(count => 2)
        expect(run(klass, job)).to be(false)

        expect(scheduled(klass).map { |e| e.item[count] }).to eq([2])
        expect(log.string.lines.grep(/lock_manager: skipped/))
          .to match([end_with("lock_manager: skipped ExhaustedJob jid=#{job["jid"]}: lock \"busy\" is held after 2 " \
                              "reschedules (max_reschedules)\n")])
      end

      it "raises LockNotAcquired past max_reschedules with when_exhausted: :raise" do
        klass = job_class("RaisingJob") do
          lock_with key: "busy", on_conflict: :reschedule, max_reschedules: 0, when_exhausted: :raise
        end
        elsewhere.try_lock("busy")
        expect { run(klass, job_hash(klass)) }.to raise_error(LockManager::LockNotAcquired, /"busy"/)
        expect(scheduled(klass)).to eq([])
      end

      it "counts again for Sidekiq's retry of a job that failed in its own code, not of one that gave up" do
        klass = job_class("RetriedJob") { lock_with key: "busy", on_conflict: :reschedule, max_reschedules: 3 }
        elsewhere.try_lock("busy")
        run(klass, job_hash(klass, retry_count: 0, error_class: "RuntimeError").merge(count => 3))
        expect(scheduled(klass).map { |e| e.item[count] }).to eq([1])

        gave_up = job_hash(klass, retry_count: 0, error_class: "LockManager::LockNotAcquired").merge(count => 3)
        expect(run(klass, gave_up)).to be(false)
        expect(log.string).to include("skipped RetriedJob jid=#{gave_up["jid"]}: lock \"busy\" is held after 3")
      end

      it "counts again for Sidekiq's retry of a wrapped ActiveJob that failed in its own code: in its data" do
        plain = Class.new { include Sidekiq::Worker }
        data = { "job_class" => "SomeJob", "arguments" => [], count => 2 }
        failed = { "class" => "JobWrapper", "wrapped" => "SomeJob", "args" => [data], "error_class" => "Boom" }
        middleware.call(plain.new, failed, "default") { nil }
        expect(data).not_to have_key(count)

        data = { "job_class" => "SomeJob", "arguments" => [], count => 2 }
        gave_up = failed.merge("args" => [data], "error_class" => "LockManager::LockNotAcquired")
        middleware.call(plain.new, gave_up, "default") { nil }
        expect(data[count]).to eq(2)
      end

      it "forgets the count once the job runs" do
        klass = job_class("RunsJob") { lock_with key: "free", on_conflict: :reschedule }
        job = job_hash(klass).merge(count => 4)
        expect(run(klass, job)).to be(true)
        expect(job).not_to have_key(count)
      end
    end

    it "raises LockNotAcquired (for Sidekiq's retry) with on_conflict: :raise" do
      klass = job_class { lock_with key: "busy", on_conflict: :raise }
      elsewhere.try_lock("busy")
      expect { run(klass, job_hash(klass)) }.to raise_error(LockManager::LockNotAcquired) { |e|
                                                  expect(e.key).to eq("busy")
                                                }
    end

    it ":blocking waits for the lock, then raises LockNotAcquired after timeout" do
      klass = job_class { lock_with :blocking, key: "busy", timeout: 0.3 }
      holder = elsewhere.try_lock("busy")
      Thread.new { sleep(0.1) && holder.release }
      expect(run(klass, job_hash(klass))).to be(true)

      elsewhere.try_lock("busy")
      expect { run(klass, job_hash(klass)) }.to raise_error(LockManager::LockNotAcquired)
    end

    it "lets set(lock_manager: ...) at enqueue time override the class's options" do
      klass = job_class { lock_with key: "class-key" }
      LockManager::Locker.instance.try_lock("class-key")
      expect(run(klass, job_hash(klass, lock_manager: { "key" => "other-key" }))).to be(true)
      expect { run(klass, job_hash(klass, lock_manager: { "on_conflict" => "nope" })) }
        .to raise_error(ArgumentError, /on_conflict/)
    end

    it "admits `limit` jobs at once" do
      klass = job_class { lock_with key: "pool", limit: 2 }
      inner = nil
      middleware.call(klass.new, job_hash(klass), "default") do
        middleware.call(klass.new, job_hash(klass), "default") { inner = run(klass, job_hash(klass)) }
      end
      expect(inner).to be(false)
    end

    it "renews the lock of a job that outlives its timeout (renew: true), up to max_hold" do
      klass = job_class { lock_with key: "long", timeout: 0.3, renew: true, max_hold: 30 }
      expect(klass.get_sidekiq_options["lock_manager"]).to include("renew" => true, "max_hold" => 30)
      ttl_late_in_job = nil
      middleware.call(klass.new, job_hash(klass), "default") do
        sleep 0.7
        ttl_late_in_job = redis.pttl("#{prefix}long")
      end
      expect(ttl_late_in_job).to be > 0
      expect(redis.exists?("#{prefix}long")).to be(false)
    end

    # Sidekiq 7.1+ ends a job's retries `retry_for` seconds after its first failure (and at max_retries,
    # on 7); Sidekiq 8 no longer counts them then. 6.4 knows only the count.
    describe "a failed :until_executed job with retry_for" do
      let(:klass) { job_class("RetriedForJob") { lock_with :until_executed, unique_for: 60 } }

      def fail_once(job)
        expect { middleware.call(klass.new, job, "default") { raise "boom" } }.to raise_error("boom")
        redis.pttl("#{prefix}#{LockManager::Sidekiq::Jobs.job_lock(job, klass).key}")
      end

      # failed_at as the running Sidekiq stores it: epoch milliseconds on 8, seconds on 7.
      def failed_at(seconds_ago)
        at = Time.now.to_f - seconds_ago
        Sidekiq::VERSION.to_i >= 8 ? (at * 1_000).to_i : at
      end

      it "keeps the lock past max_retries while retry_for lasts, on Sidekiq 8 (7 and 6.4 stop at the count)" do
        ttl = fail_once(job_hash(klass, 1, retry: true, retry_count: 30, retry_for: 3_600, failed_at: failed_at(60)))
        expect(ttl).to(Sidekiq::VERSION.to_i >= 8 ? be > 60_000 : eq(-2))
      end

      it "releases the lock once retry_for has passed, retries left or not (Sidekiq 7.1+; 6.4 ignores it)" do
        ttl = fail_once(job_hash(klass, 2, retry: true, retry_count: 1, retry_for: 3_600, failed_at: failed_at(7_200)))
        expect(ttl).to(Gem::Version.new(Sidekiq::VERSION) >= Gem::Version.new("7.1") ? eq(-2) : be > 60_000)
      end
    end

    it "runs perform_inline under the job's lock and releases it, outside a Sidekiq server" do
      script = <<~RUBY
        require "active_support/core_ext/string/inflections" # Sidekiq 6.4's perform_inline calls String#constantize
        require "lock_manager/sidekiq"
        LockManager.configure { |c| c.redis_url = ENV["REDIS_URL"]; c.key_prefix = ENV["PREFIX"] }
        Sidekiq.configure_client { |c| c.redis = { url: ENV["REDIS_URL"] } }
        class InlineJob
          include LockManager::Worker
          lock_with :until_executed, key: ->(id) { "inline:\#{id}" }, unique_for: 60
          def perform(id) = ($held = LockManager::Locker.instance.locked?("inline:\#{id}"))
        end
        ran = InlineJob.perform_inline(1)
        puts [ran, $held, LockManager::Locker.instance.locked?("inline:1"), !InlineJob.perform_async(1).nil?].inspect
      RUBY
      output, status = Open3.capture2e({ "REDIS_URL" => redis_url, "PREFIX" => prefix }, RbConfig.ruby,
                                       "-I", File.expand_path("../../lib", __dir__), "-e", script)
      expect(status).to be_success, output
      # ran, held while it ran, free after it, so the next push is accepted
      expect(output.lines.last.strip).to eq("[true, true, false, true]")
    end

    it "is registered once in a Sidekiq server by require \"lock_manager/sidekiq\"" do
      script = <<~RUBY
        require "sidekiq/cli" # what makes Sidekiq.server? true, as in a real server process
        require "lock_manager/sidekiq"
        LockManager::Sidekiq.install
        config = Sidekiq.respond_to?(:default_configuration) ? Sidekiq.default_configuration : Sidekiq # 7+ : 6.4
        puts config.server_middleware.entries.map(&:klass).inspect
      RUBY
      output, status = Open3.capture2e(RbConfig.ruby, "-I", File.expand_path("../../lib", __dir__), "-e", script)
      expect(status).to be_success, output
      # Sidekiq 7 and 8 bring middlewares of their own: ours is there once, after them.
      expect(output.lines.last.scan("LockManager::Sidekiq::ServerMiddleware").size).to eq(1)
    end
  end

  describe LockManager::Lockable do
    let(:controller) { Class.new { include LockManager::Lockable }.new }

    before { configure_shared_locker! }

    it "yields :locked, and :skipped while someone else holds the lock, releasing only its own" do
      statuses = []
      controller.with_lock("lesson:1", ttl: 10) do |status|
        statuses << status
        Thread.new { controller.with_lock("lesson:1") { |inner| statuses << inner } }.join # another request
        expect(redis.exists?("#{prefix}semaphore_lock:lesson:1")).to be(true)
      end

      expect(statuses).to eq(%i[locked skipped])
      expect(redis.exists?("#{prefix}semaphore_lock:lesson:1")).to be(false)
    end

    it "returns the block's value and uses its namespace" do
      value = controller.with_lock("x", namespace: "orders") { held_keys(redis, "#{prefix}*") }
      expect(value).to eq(["#{prefix}orders:x"])
    end

    it "takes Rails durations (ttl: 10.seconds), as the seed's helper does" do
      key = "#{prefix}semaphore_lock:rails"
      script = <<~RUBY
        require "json"
        require "active_support"
        require "active_support/core_ext/numeric/time"
        require "lock_manager"
        LockManager.configure { |c| c.redis_url = #{redis_url.inspect}; c.key_prefix = #{prefix.inspect} }
        helper = Class.new { include LockManager::Lockable }.new
        ttl = helper.with_lock("rails", ttl: 10.seconds) { Redis.new(url: #{redis_url.inspect}).pttl(#{key.inspect}) }
        waited = LockManager::Locker.blocking_lock("rails", timeout: 2.seconds) { "ran" }
        puts JSON.generate([ttl, waited])
      RUBY
      lib = File.expand_path("../../lib", __dir__)
      output, status = Open3.capture2e(RbConfig.ruby, "-I", lib, "-r", "redis", "-e", script)
      expect(status).to be_success, output
      ttl, waited = JSON.parse(output.lines.last)
      expect(ttl).to be_between(9_000, 10_000)
      expect(waited).to eq("ran")
    end

    it "expires by ttl and never deletes the next holder's lock" do
      controller.with_lock("slow", ttl: 0.1) do
        sleep 0.2
        expect(controller.with_lock("slow", ttl: 30) { |status| status }).to eq(:locked)
      end
      expect(redis.exists?("#{prefix}semaphore_lock:slow")).to be(false) # the inner one released its own
    end
  end
end
