# frozen_string_literal: true

require "spec_helper"
require "logger"
require "rbconfig"
require "stringio"
require_relative "../support/limiter_examples"

# LockManager::Limiter on Redis: the behaviour the fake is held to, and what only Redis shows (keys,
# expiry, processes, failures).
RSpec.describe LockManager::Limiter do
  let(:limiter_name) { "limiter:#{SecureRandom.hex(4)}" }
  let(:log) { StringIO.new }

  before do
    configure_shared_locker!
    LockManager.configure { |c| c.logger = Logger.new(log) }
  end

  include_examples "a limiter backend"

  # The one key a limiter writes, found by its name.
  def limiter_keys
    redis.keys("lock_manager:*:limit:*:#{prefix}#{limiter_name}")
  end

  describe "its key" do
    it "is internal, in the slot of prefix + name, and expires once the limiter is idle again" do
      LockManager::Limiter.new(limiter_name, rate: 1, per: 10, burst: 2).try_acquire
      key = limiter_keys.first

      expect(key).to match(/\Alock_manager:\{\w+\}:limit:gcra:#{Regexp.escape(prefix + limiter_name)}\z/)
      expect(slot(key)).to eq(slot("#{prefix}#{limiter_name}"))
      expect(redis.pttl(key)).to be_between(1, 10_000) # one unit of 10 s ahead
    end

    it "lives until the window ends for a fixed window, and one window for a sliding one" do
      LockManager::Limiter.window(limiter_name, 5, per: 3600).try_acquire
      LockManager::Limiter.sliding_window(limiter_name, 5, per: 20).try_acquire
      ttls = limiter_keys.sort.map { |key| redis.pttl(key) } # sliding, window
      window_left = 3600 - (Time.now.to_f % 3600)

      expect(ttls[0]).to be_between(15_000, 20_000)
      expect(ttls[1] / 1000.0).to be_within(5).of(window_left)
    end

    it "is under the Locker's key prefix: two apps' limiters of one name count apart" do
      other = LockManager::Locker.new(redis_url: redis_url, key_prefix: "other:#{prefix}")
      mine = LockManager::Limiter.window(limiter_name, 1, per: 3600)
      theirs = LockManager::Limiter.window(limiter_name, 1, per: 3600, locker: other)

      expect([mine.try_acquire, theirs.try_acquire].map(&:admitted?)).to eq([true, true])
    end
  end

  describe "bad input" do
    let(:unreachable) { LockManager::Locker.new(redis_url: closed_url, key_prefix: prefix) }

    it "is an ArgumentError naming the argument, raised before anything reaches Redis" do
      build = ->(**options) { described_class.new(limiter_name, locker: unreachable, **options) }
      {
        -> { build.call(per: 1) } => /needs one of rate:, window: or sliding_window:, got \[\]/,
        -> { build.call(rate: 0) } => /rate must be a positive number/,
        -> { build.call(rate: 5, per: 0) } => /per must be a positive number of seconds/,
        -> { build.call(rate: 5, burst: 0) } => /burst must be an Integer from 1/,
        -> { build.call(window: 5, burst: 2) } => /burst applies to rate: only/,
        -> { build.call(window: 2.5) } => /window must be an Integer/,
        -> { build.call(rate: 2_000_001) } => /at most 1000000 per second/,
        -> { described_class.new("", rate: 1) } => /name must not be empty/,
        -> { build.call(rate: 1).try_acquire(cost: 0) } => /cost must be an Integer from 1/,
        -> { build.call(rate: 1).try_acquire(cost: 2) } => /cost 2 is more than burst \(1\)/,
        -> { build.call(rate: 1).try_acquire(wait: -1) } => /wait must be a positive number of seconds/,
        -> { build.call(rate: 1).within_limit(on_redis_error: :maybe) { nil } } => /on_redis_error must be :raise/
      }.each do |call, message|
        expect(&call).to raise_error(ArgumentError, message)
      end
      expect { build.call(rate: 1).within_limit }.to raise_error(ArgumentError, /a block is required/)
    end
  end

  describe "when Redis cannot be reached" do
    let(:unreachable) { LockManager::Locker.new(redis_url: closed_url, key_prefix: prefix, connect_timeout: 0.5) }
    let(:api) { described_class.new(limiter_name, rate: 1, locker: unreachable) }

    it "raises the gem's ConnectionError naming the limiter" do
      expect { api.try_acquire }.to raise_error(LockManager::ConnectionError, /limiter "#{limiter_name}"/)
      expect { api.within_limit { raise "ran" } }.to raise_error(LockManager::ConnectionError)
    end

    it "runs the block unlimited with on_redis_error: :run, skips it with :skip, and logs why" do
      expect(api.within_limit(on_redis_error: :run) { |limit| [:ran, limit] }).to eq([:ran, nil])
      expect(api.within_limit(on_redis_error: :skip) { raise "ran" }).to be_nil
      expect(log.string).to include("running without the limiter #{limiter_name.inspect}",
                                    "treating it as over its limit #{limiter_name.inspect}")
    end
  end

  it "sends throttle.lock_manager for each decision to those who listen" do
    events = []
    subscriber = LockManager.subscribe("throttle.lock_manager") { |event| events << event.payload }
    api = described_class.new(limiter_name, rate: 1, per: 60)
    2.times { api.try_acquire }
    LockManager.unsubscribe(subscriber)

    expect(events).to match([
                              include(limiter: limiter_name, rule: "1 per 60s, burst 1", cost: 1, admitted: true,
                                      remaining: 0, retry_after: 0.0),
                              include(admitted: false, retry_after: be_between(50, 60))
                            ])
  end

  describe ".concurrent" do
    let(:imports) { described_class.concurrent(limiter_name, 2, timeout: 5) }

    # Holds one place from another thread until the returned queue is pushed to.
    def hold_place
      inside = Queue.new
      leave = Queue.new
      thread = Thread.new { imports.within_limit { inside << true and leave.pop } }
      inside.pop
      [thread, leave]
    end

    it "runs `limit` blocks at once and refuses the next with OverLimit, or waits for a place" do
      holders = Array.new(2) { hold_place }

      expect { imports.within_limit { raise "ran" } }.to raise_error(LockManager::OverLimit, /2 at once/)
      Thread.new { sleep 0.3 and holders.first.last << true }
      expect(imports.within_limit(wait: 5, &:fencing_token)).to be_a(Integer)
      holders.last.last << true
      holders.each { |thread, _| thread.join }
    end

    it "refuses a thread already inside a limit-1 limiter instead of waiting for itself" do
      single = described_class.concurrent(limiter_name, 1, timeout: 5)

      nested = single.within_limit do
        single.within_limit(wait: 1) { :ran }
      rescue LockManager::OverLimit => e
        e
      end
      expect(nested).to be_a(LockManager::OverLimit)
    end
  end

  it "stops a wait at once for Thread#raise, and the limiter goes on serving others" do
    api = described_class.new(limiter_name, rate: 1, per: 30)
    api.try_acquire
    waiter = Thread.new { api.try_acquire(wait: 60) }
    waiter.report_on_exception = false
    sleep 0.3

    took = elapsed do
      waiter.raise(Interrupt, "stop")
      expect { waiter.join }.to raise_error(Interrupt, "stop")
    end
    expect(took).to be < 2
    expect(LockManager.locker.pool_state.first).to eq(LockManager.locker.pool_state.last) # none checked out
  end

  it "admits exactly the limit across 4 processes of 4 threads each", timeout: 90 do
    script = <<~RUBY
      require "lock_manager"
      locker = LockManager::Locker.new(redis_url: ARGV[0], key_prefix: ARGV[1], pool_size: 4)
      limiter = LockManager::Limiter.window(ARGV[2], 100, per: 3600, locker: locker)
      $stdin.gets
      counts = Array.new(4) { Thread.new { Array.new(60) { limiter.try_acquire.admitted? }.count(true) } }
      puts counts.sum(&:value)
    RUBY
    children = Array.new(4) do
      IO.popen([RbConfig.ruby, "-I", File.expand_path("../../lib", __dir__), "-e", script, redis_url, prefix,
                limiter_name], "r+")
    end
    children.each { |child| child.puts("go") }
    admitted = children.sum { |child| Integer(child.read) }
    children.each(&:close)

    expect(admitted).to eq(100) # of 960 attempts
  end
end
