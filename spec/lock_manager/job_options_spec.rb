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
