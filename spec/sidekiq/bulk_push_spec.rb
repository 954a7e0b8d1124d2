# frozen_string_literal: true

require "spec_helper"
require "digest"
require "json"
require_relative "../support/sidekiq_client"
require_relative "../support/slow_link"
require_relative "../support/unique_jobs"

# push_bulk and perform_bulk of unique jobs, from this process (as a web process pushes) to a
# private redis-server, into a queue no process reads. See also uniqueness_spec.rb.
RSpec.describe "Sidekiq bulk pushes of unique jobs" do
  unique_for = UniqueJobs::UNIQUE_FOR

  before(:all) do
    @server = RedisServer.new.start
  end

  after(:all) { @server&.shutdown }

  include_context "a Sidekiq client of its own"

  before do
    use_locks("bulk:")
    @client_log.truncate(0)
    @client_log.rewind
  end

  after do
    admin.del("queue:parked", "schedule")
  end

  let(:parked) { UniqueJobs::BulkJob.set(queue: "parked") }
  let(:base) { rand(1 << 30) * 1_000 }

  def key_of(*args)
    "bulk:#{UniqueJobs::BulkJob.name}:#{Digest::SHA256.hexdigest(JSON.generate(args))[0, 32]}"
  end

  # [key, holder jid] of each push this process refused, from its Sidekiq log.
  def refusals
    @client_log.string.scan(/lock_manager: refused \S+ jid=\h+: lock "([^"]+)" is held by jid=(\h+)$/)
  end

  def jobs_in(queue)
    admin.lrange(queue, 0, -1).map { |json| JSON.parse(json) }
  end

  # The times the scheduled jobs are due (the scores of Sidekiq's schedule set).
  def scheduled_times
    admin.zrange("schedule", 0, -1, with_scores: true).map(&:last)
  end

  it "perform_bulk(args * 2): the first of each pair is accepted, its repeat (the same Array) refused; " \
     "the claims take one round trip" do
    args = Array.new(100) { |n| [base + n] }
    link = SlowLink.new(@server.port)
    use_locks("bulk:", url: link.url)
    parked.perform_bulk([[base - 1]]) # opens the pooled connection and loads the claim script, through the link
    link.slow_down(0.3)
    result = parked.perform_bulk(args * 2)
    round_trips = link.round_trips
    link.close

    jids = result.compact
    expect(jids.size).to eq(100)
    expect(result.first(100)).to all(be_a(String)) # 6.4 leaves the refused out of its list, 7+ has nil
    expect(result.drop(100)).to all(be_nil)
    queued = jobs_in("queue:parked").reject { |job| job["args"] == [base - 1] }
    expect(queued.map { |job| job["jid"] }).to match_array(jids)
    expect(queued.to_h { |job| [job["jid"], job["args"]] }).to eq(jids.zip(args).to_h)
    expect(admin.mget(*args.map { |job_args| key_of(*job_args) })).to eq(jids)
    expect(refusals).to eq(args.map { |job_args| key_of(*job_args).delete_prefix("bulk:") }.zip(jids))
    expect(round_trips).to eq(1)
  ensure
    link&.close
  end

  it "push_bulk with the same Array at three places keeps the first, and releases nothing of it" do
    same = [base]
    other = [base + 1]
    result = Sidekiq::Client.push_bulk("class" => UniqueJobs::BulkJob, "queue" => "parked",
                                       "args" => [same, other, same, same])

    expect(result.compact.size).to eq(2)
    expect(result.first).to be_a(String)
    expect(admin.get(key_of(base))).to eq(result.first)
    expect(admin.get(key_of(base + 1))).to eq(result.compact.last)
    expect(refusals.map(&:last)).to eq([result.first] * 2)
  end

  context "on Sidekiq 8" do
    before do
      skip "Sidekiq #{Sidekiq::VERSION}: perform_bulk takes at: and spread_interval: on 8" if Sidekiq::VERSION.to_i < 8
    end

    it "perform_bulk(args, at:): each lock lives unique_for past the job's scheduled time" do
      at = Time.now.to_f + 600
      jids = parked.perform_bulk([[base], [base + 1]], at: at)

      expect(jids).to all(be_a(String))
      expect(scheduled_times).to match([be_within(0.001).of(at)] * 2)
      [base, base + 1].each do |number|
        expect(admin.pttl(key_of(number))).to be_within(5_000).of((600 + unique_for) * 1_000)
      end
    end

    it "perform_bulk(args, at: [...]): one time per job" do
      now = Time.now.to_f
      parked.perform_bulk([[base], [base + 1]], at: [now + 300, now + 900])

      expect(admin.pttl(key_of(base))).to be_within(5_000).of((300 + unique_for) * 1_000)
      expect(admin.pttl(key_of(base + 1))).to be_within(5_000).of((900 + unique_for) * 1_000)
    end

    it "perform_bulk(args, spread_interval:): each lock lives unique_for past the latest time Sidekiq may pick" do
      parked.perform_bulk(Array.new(20) { |n| [base + n] }, spread_interval: 600)

      expect(scheduled_times.size).to eq(20)
      latest = scheduled_times.max
      expect(latest - Time.now.to_f).to be_between(300, 600) # 20 jobs: one of them late in the 600 s
      Array.new(20) { |n| key_of(base + n) }.each do |key|
        expect(admin.pttl(key)).to be_within(5_000).of((600 + unique_for) * 1_000)
      end
    end
  end
end
