# frozen_string_literal: true

require "spec_helper"
require "rbconfig"
require "lock_manager/admin"
require_relative "../support/parking"
require_relative "../support/rails_app_server"

# bin/rails lock_manager:list, show, release, watch, parked, delete-parked, limiters and reset-limiter in the
# Rails app (a child process): exe/lock_manager's commands on the app's own settings. The app reads its Redis
# from a variable of its own (LOCK_REDIS_URL) and its key prefix from LOCK_PREFIX, which the command alone
# never sees.
RSpec.describe "the Rails app's lock_manager tasks", :rails do
  include Parking

  let(:nowhere) { closed_url }
  let(:app_env) { { "LOCK_REDIS_URL" => redis_url, "REDIS_URL" => nowhere, "LOCK_PREFIX" => prefix } }

  def rails(*args, stdin: "")
    out, err, status = RailsAppServer.rails(*args, env: app_env, stdin: stdin)
    [out, err, status.exitstatus]
  end

  it "lists, shows and releases the locks of the app's Redis under its key prefix" do
    lock = elsewhere.try_lock("report:1", timeout: 30)
    elsewhere.try_lock("report:2", timeout: 30)
    elsewhere.try_lock("other", timeout: 30)

    out, err, status = rails("lock_manager:list[report:*]")
    expect([err, status]).to eq(["", 0])
    expect(out.lines.map { |line| line.split.first }).to eq(%w[KEY report:1 report:2 2])
    expect(out).to end_with(%(2 locks matching "report:*"\n))

    out, _, status = rails("lock_manager:list[*,--limit=1]")
    expect(status).to eq(0)
    expect(out).to include("1 lock matching \"*\"; more not shown (--limit)")

    out, _, status = rails("lock_manager:show[report:1]")
    expect([out, status]).to match([include("Lock report:1 (plain lock)", "token #{lock.token}"), 0])

    out, err, status = rails("lock_manager:release[report:1]", stdin: "y\n")
    expect([out, status]).to eq(["Released lock report:1\n", 0])
    expect(err).to include("Release lock report:1 held by ")
    expect(rails("lock_manager:release[report:2,--yes]")).to eq(["Released lock report:2\n", "", 0])
    expect(elsewhere.locked?("report:2")).to be(false)

    expect(rails("lock_manager:show[report:1]"))
      .to eq(["", "lock_manager: no lock report:1 (nobody holds it or waits for it)\n", 1])

    # exe/lock_manager alone reads the environment, not the app: REDIS_URL, where nothing listens.
    command = [RbConfig.ruby, "-I", File.expand_path("../../lib", __dir__),
               File.expand_path("../../exe/lock_manager", __dir__), "list"]
    _, err, status = Open3.capture3(app_env, *command)
    expect([status.exitstatus, err]).to match([1, include("cannot talk to Redis at 127.0.0.1:#{URI(nowhere).port}")])
  end

  it "lists and resets the rate limiters of the app's Redis under its key prefix" do
    window = LockManager::Limiter.window("exports:1", 10, per: 86_400, locker: elsewhere) # ends at midnight UTC
    rate = LockManager::Limiter.new("exports:1", rate: 1, per: 3600, burst: 3, locker: elsewhere)
    expect([window, rate].map { |limiter| Array.new(2) { limiter.try_acquire.admitted? } }).to all(eq([true, true]))

    out, err, status = rails("lock_manager:limiters[exports:*]")
    expect([err, status]).to eq(["", 0])
    expect(out.lines.map { |line| line.split.first(2) })
      .to eq([%w[NAME KIND], %w[exports:1 gcra], %w[exports:1 window], %w[2 limiters]])

    expect(rails("lock_manager:reset-limiter[exports:1,--kind=window]"))
      .to eq(["Reset limiter exports:1 (window): it admits its whole rule again\n", "", 0])
    expect(LockManager::Admin.new(elsewhere).limiters.map { |l| [l.name, l.kind] }).to eq([["exports:1", :gcra]])
    expect(rails("lock_manager:reset-limiter[exports:1,--kind=window]"))
      .to eq(["", "lock_manager: no limiter exports:1 (window) (it has counted nothing)\n", 1])
  end

  it "lists the jobs parked on a lock of the app's Redis, deletes one, and releases the lock to the first" do
    hold_for_job("report:1")
    %w[a b c].each { |jid| park_job("report:1", jid) }

    out, err, status = rails("lock_manager:list[report:*]")
    expect([err, status]).to eq(["", 0])
    expect(out.lines[1]).to end_with("0, 3 parked\n")
    out, err, status = rails("lock_manager:parked[report:1]")
    expect([err, status]).to eq(["", 0])
    expect(out.lines.drop(1).map { |line| line.split.first(3) })
      .to eq([%w[1 a ReportJob], %w[2 b ReportJob], %w[3 c ReportJob], %w[3 parked jobs]])

    expect(rails("lock_manager:delete-parked[report:1,b,--yes]"))
      .to eq(["Deleted job b parked on lock report:1: it will not run\n", "", 0])
    expect(rails("lock_manager:delete-parked[report:1,b]", stdin: "y\n"))
      .to eq(["", "Delete job b parked on lock report:1? It will not run. [y/N] " \
                  "lock_manager: no job b parked on lock report:1\n", 1])
    expect(LockManager::Admin.new(elsewhere).parked("report:1").map(&:jid)).to eq(%w[a c])

    expect(rails("lock_manager:release[report:1,--yes]"))
      .to eq(["Released lock report:1; the first of 2 parked jobs took it\n", "", 0])
    expect(elsewhere.holder("report:1")).to eq("a")
    expect(pushed_jids).to eq(["a"])
  end

  it "lists its tasks" do
    out, _, status = rails("-T", "lock_manager")
    expect(status).to eq(0)
    expect(out.lines.map { |line| line.split[1] })
      .to eq(%w[lock_manager:delete-parked[key,jid] lock_manager:limiters[pattern] lock_manager:list[pattern]
                lock_manager:parked[key] lock_manager:release[key] lock_manager:reset-limiter[name]
                lock_manager:show[key] lock_manager:watch[pattern]])
  end
end
