# frozen_string_literal: true

require "spec_helper"
require_relative "../support/browser"
require_relative "../support/web_server"
require_relative "../support/sidekiq_client"
require_relative "../support/clearable_job_helpers"

# Sidekiq's own pages remove jobs through its API: the Queues page's Delete (Queue#clear), the Retries
# page's Kill of one job and its Kill All, the Scheduled page's Delete All (Sidekiq 8). Clicked in a real
# headless Chromium, against Sidekiq::Web in a Puma process of its own that loads the jobs' classes, as
# an app's web process does; this process pushes the jobs (its client middleware claims their locks)
# to a redis-server of this file's own, where the locks live too. Runs on each stack's own Sidekiq and
# on the vendored one SIDEKIQ names. Screenshots go to tmp/web/<sidekiq version>-<page>.png.
RSpec.describe "Sidekiq's Web UI releases the locks of the jobs it removes" do
  before(:all) do
    missing = Browser.missing
    skip "spec/web skipped: #{missing}" if missing

    @server = RedisServer.new.start
    @key_prefix = "web-jobs:#{SecureRandom.hex(3)}:"
    @web = WebServer.new(redis_url: @server.url, key_prefix: @key_prefix,
                         requires: [File.expand_path("../support/clearable_jobs.rb", __dir__)]).start
    @browser = Browser.new.start
  end

  after(:all) do
    @browser&.quit
    @web&.stop
  ensure
    @server&.shutdown
  end

  include_context "a Sidekiq client of its own"
  include ClearableJobHelpers

  let(:prefix) { @key_prefix }
  let(:job) { ClearableJobs::UntilExecutedJob }
  let(:modes) { [job, ClearableJobs::UntilExecutingJob, ClearableJobs::WhileExecutingJob] }

  before do
    admin.flushdb
    use_locks(prefix)
  end

  def screenshot(page)
    @browser.screenshot(File.expand_path("../../tmp/web/#{Sidekiq::VERSION}-#{page}.png", __dir__))
  end

  # The jids of the jobs the page lists with a checkbox; nil while it is being replaced.
  def listed_jids
    @browser.all("input[name='key[]']").map { |box| box.attribute("value")[/-(\h+)\z/, 1] }
  rescue Selenium::WebDriver::Error::StaleElementReferenceError
    nil
  end

  # Clicks an element in the middle of the window, clear of the navbars Sidekiq fixes at its top and bottom
  # (a screenshot leaves the window as short as its page).
  def click(element)
    @browser.driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", element)
    element.click
  end

  # Clicks the button, accepts Sidekiq's confirm (where its page asks), and waits for the page its POST
  # redirects to: Sidekiq answers once the jobs and their locks are gone.
  def submit(button, until_page:)
    click(button)
    @browser.accept_confirm
    eventually(timeout: 15) { until_page.call }
  end

  it "Delete on the Queues page clears the queue and releases its jobs' locks" do
    jids = modes.map { |klass| park(klass, 7) }
    kept = job.set(queue: "kept").perform_async(8)
    expect(jids + [kept]).to all(be_a(String))

    @browser.visit(@web.url("/queues"))
    expect(@browser.text).to include("parked")
    screenshot("queues-before-delete")
    submit(@browser.find("form[action$='/queues/parked'] input[name=delete]"),
           until_page: -> { @browser.text.include?("kept") && !@browser.text.include?("parked") })

    expect(admin.exists?("queue:parked")).to be(false)
    expect(modes.map { |klass| holder(key_of(klass, 7)) }).to eq([nil, nil, nil])
    expect(holder(key_of(job, 8))).to eq(kept)
    expect(park(job, 7)).to be_a(String)
  end

  it "Kill of one job on the Retries page releases its lock, and only its" do
    killed, other = [1, 2].map { |id| move_to(Sidekiq::RetrySet, job, id) }

    @browser.visit(@web.url("/retries"))
    expect(listed_jids).to contain_exactly(killed, other)
    click(@browser.find("input[name='key[]'][value$='-#{killed}']"))
    screenshot("retries-kill")
    submit(@browser.find("input[type=submit][name=kill]"), until_page: -> { listed_jids == [other] })

    expect(admin.zrange("dead", 0, -1).map { |line| JSON.parse(line)["jid"] }).to eq([killed])
    expect([holder(key_of(job, 1)), holder(key_of(job, 2))]).to eq([nil, other])
    expect(park(job, 1)).to be_a(String)
  end

  it "Kill All on the Retries page releases every killed job's lock" do
    jids = [1, 2, 3].map { |id| move_to(Sidekiq::RetrySet, job, id) }
    admin.set("#{prefix}#{key_of(job, 3)}", "newer-jid") # taken by another jid meanwhile: left alone

    @browser.visit(@web.url("/retries"))
    expect(listed_jids).to contain_exactly(*jids)
    kill_all = @browser.all("form[action$='/retries/all/kill'] input[type=submit], " \
                            "button[formaction$='/retries/all/kill']").first
    submit(kill_all, until_page: -> { listed_jids == [] })

    expect(admin.zrange("dead", 0, -1).map { |line| JSON.parse(line)["jid"] }).to match_array(jids)
    expect([1, 2, 3].map { |id| holder(key_of(job, id)) }).to eq([nil, nil, "newer-jid"])
  end

  it "Delete All on the Scheduled page releases the scheduled jobs' locks" do
    scheduled = [1, 2].map { |id| job.perform_in(3600, id) }
    @browser.visit(@web.url("/scheduled"))
    delete_all = @browser.all("button[formaction$='/scheduled/all/delete']").first
    skip "Sidekiq #{Sidekiq::VERSION}'s Scheduled page has no Delete All" unless delete_all

    expect(listed_jids).to contain_exactly(*scheduled)
    submit(delete_all, until_page: -> { listed_jids == [] })

    expect(admin.exists?("schedule")).to be(false)
    expect([1, 2].map { |id| holder(key_of(job, id)) }).to eq([nil, nil])
    expect(job.perform_in(3600, 1)).to be_a(String)
  end
end
