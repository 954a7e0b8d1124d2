# frozen_string_literal: true

require "spec_helper"
require "socket"

# The topology settings (sentinels, sentinel_master, cluster, min_replicas, replica_timeout) are
# checked like the others: a bad one raises ArgumentError naming it, at Locker.new and at
# LockManager.configure (which then changes nothing), before anything reaches Redis, and never
# with a password of a URL in the message. The URLs name a TCP listener of the example's own: a
# connection to it would show.
RSpec.describe "Topology settings", :topology do
  let(:listener) { TCPServer.new("127.0.0.1", 0) }
  let(:password) { "s3cret-#{SecureRandom.hex(4)}" }
  let(:url) { "redis://:#{password}@127.0.0.1:#{listener.addr[1]}" }
  let(:sentinel) { { sentinels: [url], sentinel_master: "mymaster" } }

  after { listener.close }

  # Locker.new and LockManager.configure with `options` (on a redis_url with the password too):
  # each must raise ArgumentError matching `names`, without the password.
  # `bad` as a sentinel (beside a good one, unless `beside` is nil) and as a cluster seed: both refused.
  def expect_refused_node(bad, beside: url)
    expect_refused({ sentinels: beside ? [beside, bad] : [bad], sentinel_master: "mymaster" }, :sentinels)
    expect_refused({ cluster: [bad] }, :cluster)
  end

  def expect_refused(options, *names)
    config_before = LockManager.config.to_h
    errors = [
      refusal("Locker.new(#{options.keys.join(", ")})") do
        LockManager::Locker.new(redis_url: "#{url}/0", key_prefix: prefix, **options)
      end,
      refusal("LockManager.configure(#{options.keys.join(", ")})") do
        LockManager.configure do |c|
          c.redis_url = "#{url}/0"
          options.each { |name, value| c.public_send("#{name}=", value) }
        end
      end
    ]
    errors.each do |error|
      names.each { |name| expect(error.message).to include(name.to_s) }
      expect(error.message).not_to include(password)
    end
    expect(LockManager.config.to_h).to eq(config_before) # nothing changed
    errors.first.message
  end

  # The ArgumentError the block raised; `how` names the call when it raised nothing.
  def refusal(how)
    yield
    raise RSpec::Expectations::ExpectationNotMetError, "#{how}: expected ArgumentError, nothing was raised"
  rescue ArgumentError => e
    e
  end

  def expect_nothing_connected
    expect { listener.accept_nonblock }.to raise_error(IO::WaitReadable)
  end

  it "sentinels and cluster together" do
    message = expect_refused({ **sentinel, cluster: [url] }, :sentinels, :cluster)
    expect(message).to match(/exclude/)
    expect_nothing_connected
  end

  it "sentinels without sentinel_master, and sentinel_master without sentinels" do
    expect_refused({ sentinels: [url] }, :sentinel_master)
    expect_refused({ sentinel_master: "mymaster" }, :sentinels)
    expect_refused({ sentinels: nil, sentinel_master: "mymaster" }, :sentinels)
    expect_refused({ sentinels: [url], sentinel_master: nil }, :sentinel_master)
    expect_nothing_connected
  end

  it "a sentinel_master that is not a non-empty String" do
    ["", :mymaster, 42].each { |name| expect_refused({ sentinels: [url], sentinel_master: name }, :sentinel_master) }
    expect_nothing_connected
  end

  it "empty arrays" do
    expect_refused({ sentinels: [], sentinel_master: "mymaster" }, :sentinels)
    expect_refused({ cluster: [] }, :cluster)
    expect_nothing_connected
  end

  it "a URL where an Array of them is expected, without showing its password" do
    expect_refused({ sentinels: url, sentinel_master: "mymaster" }, :sentinels)
    expect_refused({ cluster: url }, :cluster)
    expect_nothing_connected
  end

  it "strings that are not redis:// URLs" do
    port = listener.addr[1]
    ["127.0.0.1:#{port}", "sentinel.example", "http://:#{password}@127.0.0.1:#{port}",
     "sentinel://:#{password}@127.0.0.1:#{port}", "", nil, 26_379].each do |bad|
      expect_refused_node(bad)
    end
    expect_nothing_connected
  end

  it "a URL whose scheme is missing, without showing its password" do
    port = listener.addr[1]
    [":#{password}@127.0.0.1:#{port}", "default:#{password}@127.0.0.1:#{port}"].each do |bad|
      expect_refused_node(bad, beside: nil)
    end
    expect_nothing_connected
  end

  it "redis:// URLs that cannot be parsed" do
    port = listener.addr[1]
    ["redis://:#{password}@127.0.0.1:not-a-port", "redis://:#{password}@127.0.0.1:99999",
     "redis://:#{password}@127.0.0.1:#{port}/not-a-db", "redis://:#{password}@[::1"].each do |bad|
      expect_refused({ sentinels: [url, bad], sentinel_master: "mymaster" }, :sentinels)
      expect_refused({ cluster: [url, bad] }, :cluster)
    end
    expect_nothing_connected
  end

  it "unix:// URLs for sentinels or cluster nodes" do
    ["unix:///tmp/sentinel.sock", "unix://:#{password}@/tmp/sentinel.sock"].each do |socket|
      message = expect_refused({ sentinels: [url, socket], sentinel_master: "mymaster" }, :sentinels)
      expect(message).to match(/unix/)
      expect_refused({ cluster: [socket] }, :cluster)
    end
    expect_nothing_connected
  end

  it "min_replicas that is negative or not an Integer" do
    [-1, 1.5, "1", nil, 1r, 1_000_000].each { |bad| expect_refused({ min_replicas: bad }, :min_replicas) }
    expect_nothing_connected
  end

  it "replica_timeout not shorter than read_timeout when min_replicas > 0, or not a positive number" do
    expect_refused({ min_replicas: 1, replica_timeout: 1.0, read_timeout: 1.0 }, :replica_timeout, :read_timeout)
    expect_refused({ min_replicas: 2, replica_timeout: 3, read_timeout: 0.5 }, :replica_timeout, :read_timeout)
    expect_refused({ min_replicas: 1, replica_timeout: 1.5 }, :replica_timeout, :read_timeout) # read_timeout 1.0
    expect_refused({ **sentinel, min_replicas: 1, replica_timeout: 2, read_timeout: 1 }, :replica_timeout)
    [0, -0.1, "0.05", nil].each { |bad| expect_refused({ replica_timeout: bad }, :replica_timeout) }
    expect_nothing_connected
  end

  it "accepts the good ones without connecting (Redis is reached on first use)" do
    lockers = [
      LockManager::Locker.new(redis_url: "#{url}/0", key_prefix: prefix, **sentinel),
      LockManager::Locker.new(redis_url: "#{url}/0", key_prefix: prefix, cluster: [url, url.sub("redis:", "rediss:")]),
      LockManager::Locker.new(redis_url: "#{url}/0", key_prefix: prefix, min_replicas: 0, replica_timeout: 5),
      LockManager::Locker.new(redis_url: "#{url}/0", key_prefix: prefix, min_replicas: 1_000, replica_timeout: 0.9)
    ]
    LockManager.configure do |c|
      c.sentinels = [url]
      c.sentinel_master = "mymaster"
      c.min_replicas = 1
      c.replica_timeout = 0.5
    end

    expect(lockers.map { |locker| locker.settings.values_at(:sentinel_master, :min_replicas) })
      .to eq([["mymaster", 0], [nil, 0], [nil, 0], [nil, 1_000]])
    expect(LockManager.config.to_h).to include(sentinel_master: "mymaster", min_replicas: 1, replica_timeout: 0.5)
    (lockers.map(&:inspect) + [LockManager.config.inspect]).each { |text| expect(text).not_to include(password) }
    expect_nothing_connected
  end
end
