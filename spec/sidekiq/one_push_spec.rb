# frozen_string_literal: true

require "spec_helper"
require "open3"
require "sidekiq"
require_relative "../support/process_helpers"
require_relative "../support/slow_link"
require_relative "../support/sidekiq_client"
require_relative "../support/unique_jobs"

# Where Sidekiq's Redis is the locks' Redis, a unique job's claim and its push are one script, one
# round trip (OnePush): the job is pushed with its lock or not at all, a reply lost is never sent again.
RSpec.describe "Sidekiq pushes that carry their claim" do
  before(:all) { @server = RedisServer.new.start }
  after(:all) { @server&.shutdown }

  include_context "a Sidekiq client of its own"

  let(:job) { UniqueJobs::UntilExecutedJob }
  let(:base) { rand(1 << 30) }

  before do
    use_locks("one:")
    job.perform_async(base - 1, 0) # the pooled connections opened, the script loaded, the Redis compared
  end

  # The commands clients sent Redis while the block ran (MONITOR; not those the scripts ran, nor
  # redis-client's prelude as it opens a connection, HELLO and two CLIENT SETINFO: a pool may open one
  # again at any time, and a loaded machine's run on Sidekiq 8.1.7 counted 4 commands for a refused push).
  def sent
    monitor = ProcessHelpers::Monitor.new(@server.port)
    yield
  ensure
    sent = monitor&.stop&.reject { |source, _| source == "lua" }&.map(&:last)
    @sent = sent&.grep_v(/\A"(HELLO|AUTH|SELECT|CLIENT)" /i)
  end

  def queued(args)
    admin.lrange("queue:default", 0, -1).map { |json| JSON.parse(json) }.select { |entry| entry["args"] == args }
  end

  def lock_of(*args)
    "one:#{job.name}:#{Digest::SHA256.hexdigest(JSON.generate(args))[0, 32]}"
  end

  it "an accepted push is one script: its lock and its job, nothing from Sidekiq's own connection" do
    jid = nil
    sent { jid = job.perform_async(base, 0) }

    expect(@sent).to match([start_with('"EVALSHA"')])
    expect(queued([base, 0]).map { |entry| entry["jid"] }).to eq([jid])
    expect(admin.get(lock_of(base, 0))).to eq(jid)
    expect(admin.pttl(lock_of(base, 0))).to be_between(1, UniqueJobs::UNIQUE_FOR * 1_000)
  end

  it "a refused push is one script too: nothing pushed, the holder's lock as it was" do
    holder = job.perform_async(base, 0)
    ttl = admin.pttl(lock_of(base, 0))
    result = :unset
    sent { result = job.perform_async(base, 0) }

    expect(result).to be_nil
    expect(@sent).to match([start_with('"EVALSHA"')])
    expect(queued([base, 0]).map { |entry| entry["jid"] }).to eq([holder])
    expect(admin.get(lock_of(base, 0))).to eq(holder)
    expect(admin.pttl(lock_of(base, 0))).to be <= ttl
    expect(@client_log.string).to include("is held by jid=#{holder}")
  end

  it "a push refused by a lock a thread holds (Locker#try_lock of the same key) names that holder's token, not a jid" do
    key = lock_of(base, 1).delete_prefix("one:") # the shared Locker's prefix
    held = LockManager.locker.try_lock(key, timeout: 30)

    expect(job.perform_async(base, 1)).to be_nil
    expect(@client_log.string).to include(%(lock "#{key}" is held by #{held.token}))
    expect(@client_log.string).not_to include("jid=#{held.token}")
  ensure
    held&.release
  end

  it "a process that loads only Sidekiq (no redis-rb: Sidekiq 7 and 8) compares the two Redis and carries its claims" do
    script = <<~RUBY
      require "sidekiq"
      require "lock_manager"
      class OnePushChildJob
        include Sidekiq::Worker
        include LockManager::Worker
        lock_with :until_executed, unique_for: 60
        def perform(*); end
      end
      Sidekiq.configure_client { |config| config.redis = { url: ENV.fetch("URL") } }
      LockManager.configure { |config| config.redis_url = ENV.fetch("URL") }
      jid = OnePushChildJob.perform_async(#{base})
      puts [jid.class, LockManager::Sidekiq::OnePush.possible?(Sidekiq.redis_pool)].inspect
    RUBY
    lib = File.expand_path("../../lib", __dir__)
    output, status = Open3.capture2e({ "URL" => @server.url }, RbConfig.ruby, "-I", lib, "-e", script)

    expect(status).to be_success, output
    expect(output.lines.last.chomp).to eq("[String, true]")
  end

  it "perform_in: the job in Sidekiq's schedule, its lock living unique_for past the scheduled time" do
    jid = job.perform_in(600, base, 0)

    entry = admin.zrange("schedule", 0, -1, with_scores: true).find { |json, _| JSON.parse(json)["jid"] == jid }
    expect(entry.last).to be_within(5).of(Time.now.to_f + 600)
    expect(admin.get(lock_of(base, 0))).to eq(jid)
    expect(admin.pttl(lock_of(base, 0))).to be_between(600_000, (600 + UniqueJobs::UNIQUE_FOR) * 1_000)
  end

  def push_failing
    job.perform_async(base, 0)
    nil
  rescue LockManager::ConnectionError => e
    e
  end

  it "a reply lost (held past read_timeout) is not sent again: the job and its lock are there once, both" do
    link = SlowLink.new(@server.port)
    use_locks("one:", url: link.url)
    LockManager.configure do |config|
      config.read_timeout = 0.5 # the warm-up below has that long, under load
      config.connect_timeout = 5 # a loaded run's reconnect after the lost reply took more than 1 s
    end
    job.perform_async(base - 2, 0) # through the link: its connection, the Redis compared
    link.slow_down(1.5)
    error = nil
    sent { error = push_failing }

    expect(error&.message).to include("no reply within read_timeout")
    expect(@sent.grep(/\A"EVALSHA"/).size).to eq(1)
    entries = queued([base, 0])
    expect(entries.size).to eq(1)
    expect(admin.get(lock_of(base, 0))).to eq(entries.first["jid"])
  ensure
    link&.close
  end

  it "Redis paused past read_timeout: the push fails, its connection closed before the script ran: no job, no lock" do
    LockManager.configure { |config| config.read_timeout = 0.3 }
    admin.call("CLIENT", "PAUSE", "1500", "WRITE")
    error = push_failing
    admin.call("CLIENT", "UNPAUSE")
    sleep 0.2

    expect(error&.message).to include("no reply within read_timeout")
    expect(queued([base, 0])).to eq([])
    expect(admin.exists?(lock_of(base, 0))).to be(false)
  end

  it "a connection found dead (killed while idle) is sent again once: pushed once, with its lock" do
    admin.call("CLIENT", "KILL", "TYPE", "normal") # every pooled connection but admin's
    jid = nil
    sent { jid = job.perform_async(base, 0) }

    expect(jid).to be_a(String)
    expect(@sent.grep(/\A"EVALSHA"/).size).to eq(1) # the first send never reached Redis
    expect(queued([base, 0]).map { |entry| entry["jid"] }).to eq([jid])
    expect(admin.get(lock_of(base, 0))).to eq(jid)
  end
end
