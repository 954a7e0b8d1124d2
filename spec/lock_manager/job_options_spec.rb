# frozen_string_literal: true

require "spec_helper"

# A job's options are checked once per distinct (class options, job's own) pair, then shared.
RSpec.describe LockManager::CheckedJobOptions do
  let(:defaults) { { "mode" => "until_executed", "unique_for" => 60 }.freeze }

  it "checks a pair once and shares the frozen result" do
    first = described_class.fetch(defaults, { "timeout" => 5 })
    again = described_class.fetch(defaults.dup, { "timeout" => 5 })

    expect(again).to be(first)
    expect(first).to be_frozen
    expect(first).to have_attributes(mode: "until_executed", unique_for: 60, timeout: 5)
  end

  it "keeps what the job carries apart from the class's alone, and from other jobs'" do
    expect(described_class.fetch(defaults, nil).timeout).to eq(30)
    expect(described_class.fetch(defaults, { "timeout" => 7 }).timeout).to eq(7)
    expect(described_class.fetch(defaults, { "key" => "a" }).key).to eq("a")
    expect(described_class.fetch(defaults, { "key" => "b" }).key).to eq("b")
  end

  it "is not fooled by a Hash its caller changes afterwards" do
    given = { "timeout" => 9 }
    described_class.fetch(defaults, given)
    given["timeout"] = 11

    expect(described_class.fetch(defaults, given).timeout).to eq(11)
    expect(described_class.fetch(defaults, { "timeout" => 9 }).timeout).to eq(9)
  end

  it "refuses bad options every time, keeping nothing" do
    2.times do
      expect { described_class.fetch(defaults, { "timeout" => -1 }) }.to raise_error(ArgumentError, /timeout/)
    end
  end

  it "keeps at most LIMIT pairs, however many distinct options pushes make" do
    (described_class::LIMIT + 10).times { |i| described_class.fetch(defaults, { "key" => "k#{i}" }) }

    expect(described_class.instance_variable_get(:@checked).size).to be <= described_class::LIMIT
  end
end

# on_conflict: :reschedule's backoff: reschedule_in (seconds, a Proc of the attempt, or the default
# curve), max_reschedules and when_exhausted, checked once when lock_with is read.
RSpec.describe LockManager::JobOptions, "backoff" do
  def options(**given)
    described_class.new({ on_conflict: :reschedule }.merge(given))
  end

  def attempts(backoff, count, proc = nil)
    (1..count).map { |attempt| backoff.delay(attempt, "SomeJob", proc) }
  end

  it "defaults to 1, 2, 4 ... seconds, each plus up to 25%, the doubling capped at 300 s, with no limit" do
    backoff = options.backoff
    expect(backoff).to have_attributes(reschedule_in: nil, max_reschedules: nil, when_exhausted: "skip")
    expect(options.to_h).to eq("mode" => "nonblocking", "timeout" => 30, "limit" => 1, "on_conflict" => "reschedule")

    bases = [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300, 300]
    20.times do
      attempts(backoff, bases.size).zip(bases).each { |delay, base| expect(delay).to be_between(base, base * 1.25) }
    end
    expect(backoff.delay(10_000, "SomeJob")).to be_between(300, 375)
    spread = Array.new(200) { backoff.delay(3, "SomeJob") }
    expect(spread.max - spread.min).to be > 0.5 # jittered: not one moment for every job
  end

  it "takes a number as a fixed interval, plus up to 25%, and keeps it in the JSON-safe options" do
    fixed = options(reschedule_in: 10, max_reschedules: 4, when_exhausted: :raise)
    expect(fixed.to_h).to include("on_conflict" => "reschedule", "reschedule_in" => 10, "max_reschedules" => 4,
                                  "when_exhausted" => "raise")
    expect(described_class.new(fixed.to_h).backoff).to have_attributes(reschedule_in: 10, max_reschedules: 4,
                                                                       when_exhausted: "raise")
    expect(attempts(fixed.backoff, 6)).to all(be_between(10, 12.5))
  end

  it "takes a Proc of the attempt, kept out of the JSON-safe options, and checks what it returns when called" do
    proc = ->(attempt) { attempt * 1.5 }
    given = options(reschedule_in: proc)
    expect(given.backoff.reschedule_in).to be(proc)
    expect(given.to_h).not_to have_key("reschedule_in")
    expect(attempts(given.backoff, 3)).to eq([1.5, 3.0, 4.5])
    # From the job's JSON: the class's Proc, unless the job carries a number (set(lock_manager:)).
    expect(attempts(described_class.new(given.to_h).backoff, 2, proc)).to eq([1.5, 3.0])
    expect(attempts(described_class.new(given.to_h.merge("reschedule_in" => 7)).backoff, 2, proc))
      .to all(be_between(7, 8.75))

    [0, -1, "5", nil, Float::NAN].each do |bad|
      got = Regexp.escape(bad.inspect)
      message = /\ASomeJob lock_with reschedule_in\(2\) must be a positive number of seconds.*got #{got}\z/
      expect { options(reschedule_in: ->(_) { bad }).backoff.delay(2, "SomeJob") }
        .to raise_error(ArgumentError, message)
    end
  end

  {
    { reschedule_in: 0 } => /reschedule_in must be a positive number/,
    { reschedule_in: "5" } => /reschedule_in must be a positive number/,
    { reschedule_in: -> { 5 } } => /reschedule_in must be seconds or a Proc of the attempt/,
    { reschedule_in: ->(a, b) { a + b } } => /reschedule_in must be seconds or a Proc of the attempt/,
    { max_reschedules: -1 } => /max_reschedules must be an Integer, 0 or more, got -1/,
    { max_reschedules: 2.5 } => /max_reschedules must be an Integer/,
    { max_reschedules: "3" } => /max_reschedules must be an Integer/,
    { when_exhausted: :raise } => /when_exhausted needs max_reschedules/,
    { max_reschedules: 3, when_exhausted: :park } => /when_exhausted must be one of :skip, :raise, got :park/,
    { on_conflict: :skip, max_reschedules: 3 } => /max_reschedules is for on_conflict: :reschedule/,
    { on_conflict: :raise, max_reschedules: 3, when_exhausted: :raise } => /max_reschedules is for on_conflict/,
    { on_conflict: :skip, when_exhausted: :skip } => /when_exhausted is for on_conflict: :reschedule/,
    { mode: :blocking, on_conflict: :raise, max_reschedules: 1 } => /max_reschedules is for on_conflict/
  }.each do |given, message|
    it "refuses #{given.inspect}, naming the option" do
      expect { options(**given) }.to raise_error(ArgumentError, message)
    end
  end

  it "takes 0 (never rescheduled: skipped or raised at the first conflict) and a Proc that ignores its argument" do
    expect(options(max_reschedules: 0).backoff.exhausted?(0)).to be(true)
    expect(options(max_reschedules: 2).backoff).to have_attributes(max_reschedules: 2, when_exhausted: "skip")
    expect([0, 1, 2].map { |done| options(max_reschedules: 2).backoff.exhausted?(done) }).to eq([false, false, true])
    expect(options(reschedule_in: proc { 3 }).backoff.delay(1, "SomeJob")).to eq(3)
    expect(options(reschedule_in: ->(*) { 4 }).backoff.delay(1, "SomeJob")).to eq(4)
  end
end
