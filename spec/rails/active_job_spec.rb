# frozen_string_literal: true

require "spec_helper"
require_relative "../support/rails_app_server"

# ActiveJob in the Rails app (spec/support/rails_app, booted in a child process with the :test adapter): a
# unique job enqueued inside a transaction, with enqueue_after_transaction_commit (Rails 7.2+).
RSpec.describe "ActiveJob in a Rails app", :rails do
  # Runs `code` in the booted app, with `pushed` (the job_ids the adapter got) and `holder(id)` (the job_id
  # holding receipt:<id>); prints what `code` returns as JSON.
  def in_app(code)
    out, err, status = RailsAppServer.boot(env: { "REDIS_URL" => redis_url, "LOCK_PREFIX" => prefix }, code: <<~RUBY)
      pushed = -> { ActiveJob::Base.queue_adapter.enqueued_jobs.map { |job| job["job_id"] } }
      holder = ->(id) { LockManager.locker.holder("receipt:\#{id}") }
      facts = begin
        #{code}
      end
      puts JSON.generate(facts)
    RUBY
    expect(status).to be_success, err
    JSON.parse(out.lines.last)
  end

  before do
    skip "enqueue_after_transaction_commit is Rails 7.2's" if RailsAppServer.rails_version < Gem::Version.new("7.2")
  end

  it "takes a unique job's lock when the commit pushes it: perform_later returns the job, a duplicate is " \
     "refused at the commit" do
    facts = in_app(<<~RUBY)
      first = second = nil
      inside = Booking.transaction do
        first = ReceiptJob.perform_later(1)
        second = ReceiptJob.perform_later(1)
        { "returned" => [first, second].map { |job| job.class.name }, "holder" => holder.(1), "pushed" => pushed.(),
          "successfully" => [first.successfully_enqueued?, second.successfully_enqueued?] }
      end
      { "inside" => inside, "ids" => [first.job_id, second.job_id], "holder" => holder.(1), "pushed" => pushed.(),
        "successfully" => [first.successfully_enqueued?, second.successfully_enqueued?],
        "log" => File.read(ENV["RAILS_LOG_PATH"]) }
    RUBY
    first, second = facts["ids"]
    expect(facts["inside"]).to eq("returned" => %w[ReceiptJob ReceiptJob], "holder" => nil, "pushed" => [],
                                  "successfully" => [true, true])
    expect(facts.slice("holder", "pushed", "successfully"))
      .to eq("holder" => first, "pushed" => [first], "successfully" => [true, false])
    expect(facts["log"])
      .to include(%(lock_manager: refused ReceiptJob job_id=#{second}: lock "receipt:1" is held by #{first}))
  end

  it "leaves no lock (and pushes nothing) when the transaction rolls back; outside one, refuses at once" do
    facts = in_app(<<~RUBY)
      Booking.transaction do
        ReceiptJob.perform_later(2)
        raise ActiveRecord::Rollback
      end
      rolled_back = { "holder" => holder.(2), "pushed" => pushed.() }
      first = ReceiptJob.perform_later(2)
      { "rolled_back" => rolled_back, "first" => first.job_id, "holder" => holder.(2),
        "again" => ReceiptJob.perform_later(2), "pushed" => pushed.() }
    RUBY
    expect(facts["rolled_back"]).to eq("holder" => nil, "pushed" => [])
    expect(facts.slice("holder", "again", "pushed"))
      .to eq("holder" => facts["first"], "again" => false, "pushed" => [facts["first"]])
  end

  it "ActiveJob.perform_all_later in a transaction claims when it pushes: at the commit on Rails 8.1, at once on 7.2" do
    facts = in_app(<<~RUBY)
      jobs = [ReceiptJob.new(3), ReceiptJob.new(3)]
      inside = Booking.transaction do
        ActiveJob.perform_all_later(jobs)
        { "holder" => holder.(3), "pushed" => pushed.() }
      end
      { "inside" => inside, "ids" => jobs.map(&:job_id), "holder" => holder.(3), "pushed" => pushed.(),
        "successfully" => jobs.map(&:successfully_enqueued?) }
    RUBY
    first = facts["ids"].first
    at_commit = RailsAppServer.rails_version >= Gem::Version.new("8.1")
    inside = at_commit ? { "holder" => nil, "pushed" => [] } : { "holder" => first, "pushed" => [first] }
    expect(facts["inside"]).to eq(inside)
    expect(facts.slice("holder", "pushed", "successfully"))
      .to eq("holder" => first, "pushed" => [first], "successfully" => [true, false])
  end
end
