# frozen_string_literal: true

# What a limiter decides, whichever backend serves it: Redis (spec/lock_manager/limiter_spec.rb) or the
# testing mode's in-process fake (spec/testing/fake_limiter_spec.rb), which must decide the same. The
# including group gives `limiter_name`, a name no other example uses. Rates and windows are long enough
# that a loaded machine's pauses between two calls cannot change a decision.
RSpec.shared_examples "a limiter backend" do
  it "admits a GCRA limiter's burst at once, then refuses with the exact wait until the next unit" do
    api = LockManager::Limiter.new(limiter_name, rate: 1, per: 2, burst: 3)
    limits = Array.new(4) { api.try_acquire }

    expect(limits.map(&:admitted?)).to eq([true, true, true, false])
    expect(limits.map(&:remaining)).to eq([2, 1, 0, 0])
    expect(limits.first(3).map(&:retry_after)).to all(eq(0))
    # One unit every 2 s: the fourth fits once the first one's interval has passed (less the time
    # the four calls took).
    expect(limits.last.retry_after).to be > 0
    expect(limits.last.retry_after).to be <= 2.0
    expect(limits.last.reset_after).to be_between(4.0, 6.0)
  end

  it "counts a call's cost as that many units, and refuses a cost above the burst before asking" do
    api = LockManager::Limiter.new(limiter_name, rate: 1, per: 10, burst: 5)

    expect(api.try_acquire(cost: 4)).to have_attributes(admitted?: true, remaining: 1)
    expect(api.try_acquire(cost: 2)).to have_attributes(admitted?: false, remaining: 1)
    expect(api.try_acquire(cost: 2).retry_after).to be_between(5.0, 10.0)
    expect(api.try_acquire).to have_attributes(admitted?: true, remaining: 0)
    expect { api.try_acquire(cost: 6) }.to raise_error(ArgumentError, /cost 6 is more than burst \(5\)/)
  end

  # Timed from before the first call: the waiting call cannot be admitted before the first one's
  # interval has passed, however long the machine took between the two.
  it "lets a GCRA call wait out its retry_after" do
    api = LockManager::Limiter.new(limiter_name, rate: 1, per: 1, burst: 1)
    started = monotonic
    api.try_acquire

    expect(api.try_acquire(wait: 3)).to be_admitted
    expect(monotonic - started).to be_between(0.99, 3.5)
  end

  it "admits a fixed window's limit, then refuses until the window ends" do
    exports = LockManager::Limiter.window(limiter_name, 3, per: 3600)
    limits = Array.new(4) { exports.try_acquire }

    expect(limits.map(&:admitted?)).to eq([true, true, true, false])
    expect(limits.map(&:remaining)).to eq([2, 1, 0, 0])
    window_left = 3600 - (Time.now.to_f % 3600)
    expect(limits.last.retry_after).to be_within(5).of(window_left)
    expect(limits.last.reset_after).to eq(limits.last.retry_after)
  end

  it "admits an exact sliding window's limit in any window, and says when the oldest unit leaves" do
    logins = LockManager::Limiter.sliding_window(limiter_name, 3, per: 60)
    limits = Array.new(2) { logins.try_acquire } + [logins.try_acquire(cost: 2), logins.try_acquire]

    expect(limits.map(&:admitted?)).to eq([true, true, false, true])
    expect(limits.map(&:remaining)).to eq([2, 1, 1, 0])
    expect(limits[2].retry_after).to be_between(55.0, 60.0)
    expect(logins.try_acquire).to have_attributes(admitted?: false, remaining: 0)
  end

  it "lets a sliding-window call wait until enough units have left the window" do
    logins = LockManager::Limiter.sliding_window(limiter_name, 2, per: 1)
    started = monotonic
    2.times { logins.try_acquire }

    expect(logins.try_acquire(wait: 3)).to be_admitted
    expect(monotonic - started).to be_between(0.99, 3.5)
  end

  it "refuses at once when the wait would end after the deadline" do
    exports = LockManager::Limiter.window(limiter_name, 1, per: 3600)
    exports.try_acquire

    took = elapsed { expect(exports.try_acquire(wait: 2)).not_to be_admitted }
    expect(took).to be < 1.5 # waiting to the deadline would take 2 s
  end

  it "shares a limiter between objects of the same name and kind, not between kinds" do
    one = LockManager::Limiter.window(limiter_name, 2, per: 3600)
    two = LockManager::Limiter.window(limiter_name, 2, per: 3600)
    other_kind = LockManager::Limiter.sliding_window(limiter_name, 2, per: 3600)
    one.try_acquire
    two.try_acquire

    expect(one.try_acquire).not_to be_admitted
    expect(other_kind.try_acquire).to be_admitted
  end

  it "runs within_limit's block when admitted and raises OverLimit naming the limiter when not" do
    api = LockManager::Limiter.new(limiter_name, rate: 1, per: 60)

    expect(api.within_limit { |limit| [:ran, limit.remaining] }).to eq([:ran, 0])
    ran = false
    expect { api.within_limit { ran = true } }.to raise_error(LockManager::OverLimit) { |error|
      expect(error.limiter).to eq(limiter_name)
      expect(error.retry_after).to be_between(50.0, 60.0)
      expect(error.message).to match(/limiter "#{limiter_name}" is over its limit \(1 per 60s, burst 1\); retry after/)
    }
    expect(ran).to be(false)
  end

  it "takes back what an admitted decision took on give_back, for every kind" do
    limiters = [LockManager::Limiter.new(limiter_name, rate: 1, per: 3600, burst: 2),
                LockManager::Limiter.window(limiter_name, 2, per: 3600),
                LockManager::Limiter.sliding_window(limiter_name, 2, per: 3600)]
    limiters.each do |limiter|
      first = limiter.try_acquire
      second = limiter.try_acquire
      refused = limiter.try_acquire
      limiter.give_back(refused) # took nothing: gives nothing

      expect(limiter.try_acquire).not_to be_admitted
      limiter.give_back(second)
      expect(limiter.try_acquire).to have_attributes(admitted?: true, remaining: 0)
      limiter.give_back(first)
      expect(limiter.try_acquire).to have_attributes(admitted?: true, remaining: 0)
      expect(limiter.try_acquire).not_to be_admitted
    end
  end

  it "gives back nothing of a smooth rate's unit whose interval has passed: later units stand there" do
    api = LockManager::Limiter.new(limiter_name, rate: 1, per: 0.5, burst: 1)
    first = api.try_acquire
    sleep 0.6
    expect(api.try_acquire).to be_admitted

    api.give_back(first)
    expect(api.try_acquire).not_to be_admitted # else two units within far less than 0.5 s
  end

  it "forgets what it counted on reset" do
    exports = LockManager::Limiter.window(limiter_name, 1, per: 3600)
    exports.try_acquire

    expect(exports.reset).to be(true)
    expect(exports.try_acquire).to be_admitted
    exports.reset
    expect(exports.reset).to be(false)
  end

  describe "promises to jobs" do
    let(:job) { { class: "PartnerJob", jid: "abc" } }

    # Each refused job is told its own moment, one unit after the one before; each is admitted when
    # it comes back then, and newcomers (a plain call) queue behind the promises.
    def promised_in_turn(limiter, spacing)
      expect(limiter.try_acquire_for(job)).to be_admitted
      started = monotonic
      refused = Array.new(2) { limiter.try_acquire_for(job) }
      expect(refused.map(&:admitted?)).to eq([false, false])
      expect(refused.map(&:promise)).to all(be_an(Array))
      waits = refused.map(&:retry_after)
      expect(waits.last - waits.first).to be_within(0.1).of(spacing)
      newcomer = limiter.try_acquire
      expect(newcomer.retry_after).to be > waits.last
      expect(newcomer.promise).to be_nil # a plain call takes no promise

      refused.zip(waits).each do |limit, wait|
        sleep([started + wait - monotonic, 0].max)
        expect(limiter.try_acquire_for(job, limit.promise)).to be_admitted
      end
    end

    it "gives a smooth rate's refused jobs one moment each, and admits each then" do
      promised_in_turn(LockManager::Limiter.new(limiter_name, rate: 2, per: 1, burst: 1), 0.5)
    end

    it "gives a fixed window's refused jobs the next windows with room, and admits each there" do
      exports = LockManager::Limiter.window(limiter_name, 1, per: 2)
      promised_in_turn(exports, 2.0)
    end

    # A sliding window's promise allows a tenth of a window of lateness, which a loaded machine's
    # sleep may pass: only the last one, which no later promise follows, must be admitted however late.
    it "gives an exact sliding window's refused jobs one moment each, a tenth of a window apart more" do
      logins = LockManager::Limiter.sliding_window(limiter_name, 1, per: 1)
      expect(logins.try_acquire_for(job)).to be_admitted
      started = monotonic
      first, last = Array.new(2) { logins.try_acquire_for(job) }
      expect([first.retry_after, last.retry_after - first.retry_after]).to match([be_within(0.1).of(1.0),
                                                                                  be_within(0.1).of(1.1)])
      expect(logins.try_acquire_for(job, last.promise)).to have_attributes(admitted?: false, promise: last.promise)

      sleep([started + last.retry_after - monotonic, 0].max)
      expect(logins.try_acquire_for(job, last.promise)).to be_admitted
    end

    # Back past its tenth of a window with the next promise in the way: moving its unit to now
    # would put two in one window, so it takes a new promise, after that one.
    it "gives a sliding window's job back too late for its promise a new one behind the next" do
      logins = LockManager::Limiter.sliding_window(limiter_name, 1, per: 1)
      logins.try_acquire_for(job)
      started = monotonic
      late, following = Array.new(2) { logins.try_acquire_for(job) }
      sleep([started + late.retry_after + 0.4 - monotonic, 0].max)

      again = logins.try_acquire_for(job, late.promise)
      expect(again).not_to be_admitted
      expect(again.promise).not_to eq(late.promise)
      expect(again.retry_after).to be > following.retry_after - (monotonic - started)
    end

    it "keeps a promise asked for too early, and waits for it up to PROMISE_WAIT" do
      api = LockManager::Limiter.new(limiter_name, rate: 1, per: 0.5, burst: 1)
      api.try_acquire_for(job)
      refused = api.try_acquire_for(job)
      expect(refused.retry_after).to be_between(0.3, 0.5)

      took = elapsed { expect(api.try_acquire_for(job, refused.promise)).to be_admitted }
      expect(took).to be_between(0.25, LockManager::Limiter::PROMISE_WAIT)
    end

    it "never admits more than the rule with promises: a window counts them in their window" do
      exports = LockManager::Limiter.window(limiter_name, 2, per: 3600)
      limits = Array.new(5) { exports.try_acquire_for(job) }
      expect(limits.map(&:admitted?)).to eq([true, true, false, false, false])
      expect(limits.last(3).map { |l| l.promise.first - limits.first.receipt.first }).to eq([1, 1, 2])
      # Coming back early (still in this window) is refused, keeping the promise.
      early = exports.try_acquire_for(job, limits[2].promise)
      expect(early).to have_attributes(admitted?: false, promise: limits[2].promise)
      expect(exports.try_acquire).not_to be_admitted
    end
  end
end
