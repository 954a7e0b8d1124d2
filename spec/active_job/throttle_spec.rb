# frozen_string_literal: true

require "spec_helper"
require "active_job"
require "logger"
require "stringio"

# throttle_with in ActiveJob classes, through ActiveJob's own callbacks (perform_now, as every adapter
# runs a job), on the suite's Redis; ActiveJob's test adapter keeps what a refused job enqueues again.
module AjThrottle
  RAN = Queue.new

  class ExportJob < ActiveJob::Base
    include LockManager::Worker
    self.queue_adapter = :test
    throttle_with window: 2, per: 3600, key: ->(run, account, *) { "exports:#{run}:#{account}" }
    throttle_with sliding_window: 1, per: 60, key: ->(run, _account, partner) { "partner:#{run}:#{partner}" }

    def perform(run, account, partner)
      RAN << [run, account, partner]
    end
  end

  class InlineJob < ActiveJob::Base
    include LockManager::Worker
    self.queue_adapter = :inline
    throttle_with window: 1, per: 3600, key: ->(run) { "inline:#{run}" }

    def perform(run)
      RAN << [run]
    end
  end

  class RaisingJob < ActiveJob::Base
    include LockManager::Worker
    self.queue_adapter = :test
    throttle_with window: 1, per: 3600, key: ->(run) { "raising:#{run}" }, on_limit: :raise

    def perform(run)
      RAN << [run]
    end
  end
end

RSpec.describe "throttle_with under ActiveJob" do
  let(:run) { SecureRandom.hex(4) }
  let(:log) { StringIO.new }
  let(:adapter) { AjThrottle::ExportJob.queue_adapter }

  before do
    configure_shared_locker!
    AjThrottle::ExportJob.logger = Logger.new(log)
    adapter.enqueued_jobs.clear
    AjThrottle::RAN.clear
  end

  def ran
    Array.new(AjThrottle::RAN.size) { AjThrottle::RAN.pop }
  end

  it "runs an account's 2 exports of the hour and enqueues the third again, same job_id, for the hour's end" do
    jobs = Array.new(3) { |n| AjThrottle::ExportJob.new(run, "a", "p#{n}") }
    jobs.each(&:perform_now)

    expect(ran.size).to eq(2)
    again = adapter.enqueued_jobs.last
    expect(adapter.enqueued_jobs.size).to eq(1)
    expect(again["job_id"]).to eq(jobs.last.job_id)
    window_left = 3600 - (Time.now.to_f % 3600)
    expect(again.fetch(:at) - Time.now.to_f).to be_between(window_left - 5, (window_left * 1.1) + 5)
    expect(log.string).to include("lock_manager: throttled AjThrottle::ExportJob job_id=#{jobs.last.job_id}: " \
                                  "limiter \"exports:#{run}:a\" is over its limit; runs again in")
  end

  it "carries the refused job's promise in its serialized data, and redeems it from there" do
    3.times { |n| AjThrottle::ExportJob.new(run, "e", "p#{n}").perform_now }
    again = adapter.enqueued_jobs.last
    next_window = (Time.now.to_i / 3600) + 1
    expect(again["lock_manager_promises"]).to eq("window:exports:#{run}:e" => [next_window, 0])

    # Performed again from its data before its window: refused on its promise, which it keeps.
    ActiveJob::Base.execute(again.except(:job, :args, :at, :queue).transform_keys(&:to_s))
    expect(ran.size).to eq(2)
    expect(adapter.enqueued_jobs.last["lock_manager_promises"]).to eq(again["lock_manager_promises"])
    expect(adapter.enqueued_jobs.last.fetch(:at)).to be_within(5).of(again.fetch(:at))
  end

  it "gives back the account's export when the partner's rule refuses the job" do
    AjThrottle::ExportJob.new(run, "b", "p").perform_now
    AjThrottle::ExportJob.new(run, "b", "p").perform_now

    expect(ran.size).to eq(1)
    expect(adapter.enqueued_jobs.last.fetch(:at) - Time.now.to_f).to be_between(50, 70)
    exports = LockManager::Limiter.window("exports:#{run}:b", 2, per: 3600)
    expect(exports.try_acquire).to have_attributes(admitted?: true, remaining: 0)
  end

  it "sends throttle.lock_manager for each rule's decision, naming the job" do
    events = []
    subscriber = LockManager.subscribe("throttle.lock_manager") { |event| events << event.payload }
    job = AjThrottle::ExportJob.new(run, "d", "p")
    job.perform_now
    LockManager.unsubscribe(subscriber)

    expect(events).to match([
                              include(limiter: "exports:#{run}:d", admitted: true, class: "AjThrottle::ExportJob",
                                      jid: job.job_id),
                              include(limiter: "partner:#{run}:p", admitted: true, jid: job.job_id)
                            ])
  end

  it "raises OverLimit for the app's retry_on with on_limit: :raise" do
    AjThrottle::RaisingJob.perform_now(run)

    expect { AjThrottle::RaisingJob.perform_now(run) }
      .to raise_error(LockManager::OverLimit,
                      /limiter "raising:#{run}" is over its limit \(1 per 3600s window\); retry after/)
    expect(ran).to eq([[run]])
  end

  describe "when Redis cannot be reached" do
    def unreachable(on_redis_error)
      LockManager.configure do |config|
        config.redis_url = closed_url
        config.on_redis_error = on_redis_error
        config.connect_timeout = 0.5
        config.logger = Logger.new(log)
      end
    end

    it "raises the ConnectionError by default (on_redis_error :raise)" do
      unreachable(:raise)

      expect { AjThrottle::ExportJob.perform_now(run, "c", "p") }.to raise_error(LockManager::ConnectionError)
      expect(ran).to be_empty
    end

    it "runs the job past its rules with :run, and sends it back for reschedule_in with :skip" do
      unreachable(:run)
      AjThrottle::ExportJob.perform_now(run, "c", "p")
      expect(ran.size).to eq(1)

      unreachable(:skip)
      AjThrottle::ExportJob.perform_now(run, "c", "p")
      expect(ran).to be_empty
      expect(adapter.enqueued_jobs.last.fetch(:at) - Time.now.to_f).to be_between(4, 6) # reschedule_in 5 s
      expect(log.string).to include("running without the limiter \"exports:#{run}:c\"",
                                    "treating it as over its limit \"exports:#{run}:c\"")
    end
  end

  it "raises OverLimit on an adapter that cannot schedule the refused job (:inline)" do
    AjThrottle::InlineJob.perform_later(run)

    expect { AjThrottle::InlineJob.perform_later(run) }.to raise_error(LockManager::OverLimit, /inline:#{run}/)
    expect(ran).to eq([[run]])
  end

  it "refuses a bad rule at class load, naming it" do
    expect do
      Class.new(ActiveJob::Base) do
        include LockManager::Worker
        throttle_with window: 0, per: 60
      end
    end.to raise_error(ArgumentError, /window must be an Integer/)
    expect do
      Class.new(ActiveJob::Base) do
        include LockManager::Worker
        throttle_with rate: 5, on_limit: :wait
      end
    end.to raise_error(ArgumentError, /on_limit must be :reschedule, :raise or :park/)
    expect do
      Class.new(ActiveJob::Base) do
        include LockManager::Worker
        throttle_with concurrency: 0
      end
    end.to raise_error(ArgumentError, /concurrency must be an Integer from 1/)
  end

  it "refuses on_limit: :park but for a concurrency rule, and park_limit: but with on_limit: :park" do
    [[{ rate: 5, per: 1, on_limit: :park }, /on_limit: :park is for concurrency: rules/],
     [{ concurrency: 2, park_limit: 10 }, /park_limit: is for on_limit: :park/],
     [{ concurrency: 2, on_limit: :park, park_limit: 0 },
      /park_limit must be an Integer from 1/]].each do |rule, message|
      expect { LockManager::JobThrottle.new(**rule) }.to raise_error(ArgumentError, message)
    end
    expect(LockManager::JobThrottle.new(concurrency: 2, on_limit: :park,
                                        park_limit: 10)).to have_attributes(park_limit: 10)
  end
end
