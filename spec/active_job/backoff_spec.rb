# frozen_string_literal: true

require "spec_helper"
require "active_job"
require "logger"
require "stringio"

# on_conflict: :reschedule's backoff in ActiveJob classes, through ActiveJob's own callbacks, on the suite's
# Redis: ActiveJob's test adapter keeps what `retry_job` enqueues again (its serialized data and its `at`),
# and each example performs that data as the adapter would, while another owner holds the job's lock.
module AjBackoff
  RAN = Queue.new
  ATTEMPTS = Queue.new

  # Every job keys its lock on its first argument (the example's run).
  class ApplicationJob < ActiveJob::Base
    include LockManager::Worker
    self.queue_adapter = :test

    def perform(run)
      RAN << [self.class.name, run, job_id]
    end
  end

  class CurveJob < ApplicationJob
    lock_with :nonblocking, key: ->(run) { "aj-backoff:#{run}" }, on_conflict: :reschedule, max_reschedules: 3
  end

  class ProcJob < ApplicationJob
    lock_with :nonblocking, key: ->(run) { "aj-backoff:#{run}" }, on_conflict: :reschedule, max_reschedules: 2,
                            when_exhausted: :raise, reschedule_in: ->(attempt) { (ATTEMPTS << attempt).size * 10 }
  end

  # when_exhausted: :raise into the app's retry_on.
  class RetriedJob < ApplicationJob
    lock_with :nonblocking, key: ->(run) { "aj-backoff:#{run}" }, on_conflict: :reschedule, max_reschedules: 1,
                            when_exhausted: :raise
    retry_on LockManager::LockNotAcquired, wait: 60, attempts: 5
  end

  Boom = Class.new(StandardError)

  # Fails in its own code once it runs; retry_on enqueues it again.
  class FailingJob < ApplicationJob
    lock_with :nonblocking, key: ->(run) { "aj-backoff:#{run}" }, on_conflict: :reschedule, reschedule_in: 30
    retry_on Boom, wait: 60, attempts: 3

    def perform(run)
      super
      raise Boom, "failed in its own code"
    end
  end

  # on_conflict: :park on an adapter that is not Sidekiq's: rescheduled by the backoff instead.
  class ParkJob < ApplicationJob
    lock_with :nonblocking, key: ->(run) { "aj-backoff:#{run}" }, on_conflict: :park
  end

  class InlineJob < ApplicationJob
    self.queue_adapter = :inline
    lock_with :nonblocking, key: ->(run) { "aj-backoff:#{run}" }, on_conflict: :reschedule
  end
end

RSpec.describe "on_conflict: :reschedule's backoff under ActiveJob" do
  let(:run) { SecureRandom.hex(4) }
  let(:log) { StringIO.new }
  let(:adapter) { AjBackoff::ApplicationJob.queue_adapter }
  let(:count) { LockManager::JobBackoff::COUNT }

  before do
    configure_shared_locker!
    AjBackoff::ApplicationJob.logger = Logger.new(log)
    adapter.enqueued_jobs.clear
    [AjBackoff::RAN, AjBackoff::ATTEMPTS].each(&:clear)
    elsewhere.claim(["aj-backoff:#{run}"], ["another-owner"], [60]) # held by another owner
  end

  def free
    elsewhere.release_claim("aj-backoff:#{run}", "another-owner")
  end

  def drained(queue)
    Array.new(queue.size) { queue.pop }
  end

  # Performs the job the adapter holds (what perform_enqueued_jobs does), as it would be when due.
  # @return [Hash, nil] what it enqueued again, with "delay": its `at` less the moment it was performed (the
  #   job's own delay, and the moments until `retry_job` ran: a little more on a loaded machine)
  def perform_enqueued
    data = adapter.enqueued_jobs.shift
    started = Time.now.to_f
    ActiveJob::Base.execute(data.except(:job, :args, :at, :queue, :priority).transform_keys(&:to_s))
    again = adapter.enqueued_jobs.last
    again&.merge("delay" => again.fetch(:at) - started)
  end

  it "comes back after 1, 2, 4 s (+ up to 25%), its count in its data, then is skipped at max_reschedules" do
    job = AjBackoff::CurveJob.perform_later(run)
    again = Array.new(3) { perform_enqueued }

    expect(again.map { |data| data[count] }).to eq([1, 2, 3])
    expect(again.map { |data| data["job_id"] }).to all(eq(job.job_id))
    [1, 2, 4].zip(again).each { |base, data| expect(data["delay"]).to be_between(base, (base * 1.25) + 0.5) }
    expect(log.string).to include("rescheduled AjBackoff::CurveJob job_id=#{job.job_id} in ",
                                  "(reschedule 3): lock \"aj-backoff:#{run}\" is held")

    expect(perform_enqueued).to be_nil # nothing enqueued again
    expect(log.string).to include("skipped AjBackoff::CurveJob job_id=#{job.job_id}: lock \"aj-backoff:#{run}\" is " \
                                  "held after 3 reschedules (max_reschedules)")
    expect(drained(AjBackoff::RAN)).to eq([])
  end

  it "runs once when the lock is free at last, and a later conflict of a new run starts at 1" do
    job = AjBackoff::CurveJob.perform_later(run)
    2.times { perform_enqueued }
    free

    expect(perform_enqueued).to be_nil
    expect(drained(AjBackoff::RAN)).to eq([["AjBackoff::CurveJob", run, job.job_id]])

    elsewhere.claim(["aj-backoff:#{run}"], ["another-owner"], [60])
    AjBackoff::CurveJob.perform_later(run)
    expect(perform_enqueued[count]).to eq(1)
  end

  it "asks the Proc with attempts 1, 2, then raises LockNotAcquired past max_reschedules" do
    AjBackoff::ProcJob.perform_later(run)
    again = Array.new(2) { perform_enqueued }

    expect(drained(AjBackoff::ATTEMPTS)).to eq([1, 2])
    expect(again.map { |data| [data[count], data["delay"]] })
      .to match([[1, be_between(10, 10.5)], [2, be_between(20, 20.5)]]) # as the Proc said: no jitter added
    expect { perform_enqueued }.to raise_error(LockManager::LockNotAcquired, /"aj-backoff:#{run}"/)
    expect(drained(AjBackoff::ATTEMPTS)).to eq([])
  end

  it "keeps the count through retry_on of LockNotAcquired: each retry that finds the lock held raises again" do
    job = AjBackoff::RetriedJob.perform_later(run)
    expect(perform_enqueued[count]).to eq(1)  # rescheduled
    retried = perform_enqueued                # gave up: retry_on enqueues it for its wait
    expect(retried).to include(count => 1, "job_id" => job.job_id, "delay" => be_between(55, 70))
    expect(perform_enqueued).to include(count => 1, "delay" => be_between(55, 70)) # retry_on again, not rescheduled
    expect(log.string.scan("rescheduled AjBackoff::RetriedJob").size).to eq(1)

    free
    expect(perform_enqueued).to be_nil
    expect(drained(AjBackoff::RAN)).to eq([["AjBackoff::RetriedJob", run, job.job_id]])
  end

  it "forgets the count once the job runs: retry_on after a failure in its own code starts again at 1" do
    job = AjBackoff::FailingJob.perform_later(run)
    2.times { perform_enqueued }
    free
    failed = perform_enqueued # ran, failed; retry_on enqueues it
    expect(drained(AjBackoff::RAN)).to eq([["AjBackoff::FailingJob", run, job.job_id]])
    expect(failed).not_to have_key(count)

    elsewhere.claim(["aj-backoff:#{run}"], ["another-owner"], [60])
    expect(perform_enqueued).to include(count => 1, "delay" => be_between(30, 38))
  end

  it "reschedules a job with on_conflict: :park on an adapter that is not Sidekiq's, saying why" do
    job = AjBackoff::ParkJob.perform_later(run)
    again = perform_enqueued

    expect([again[count], again["job_id"]]).to eq([1, job.job_id])
    expect(again["delay"]).to be_between(1, 1.75)
    expect(log.string).to include("not parked AjBackoff::ParkJob job_id=#{job.job_id}: lock \"aj-backoff:#{run}\" " \
                                  "is held by another-owner (a job parks where Sidekiq pushes it")
  end

  it "raises LockNotAcquired on an adapter that cannot schedule the job (:inline)" do
    expect { AjBackoff::InlineJob.perform_later(run) }
      .to raise_error(LockManager::LockNotAcquired, /"aj-backoff:#{run}"/)
    expect(drained(AjBackoff::RAN)).to eq([])
  end
end
