# frozen_string_literal: true

require "spec_helper"

RSpec.describe LockManager::Configuration do
  it "has the documented defaults" do
    config = described_class.new
    expect(config.to_h).to include(
      pool_size: 5, pool_timeout: 5, key_prefix: "lock:", connect_timeout: 1.0, read_timeout: 1.0, retry_interval: 0.1
    )
  end

  it "defaults redis_url to REDIS_URL, else the local Redis" do
    expect(described_class.new.redis_url).to eq(redis_url)
    saved = ENV.delete("REDIS_URL")
    expect(described_class.new.redis_url).to eq("redis://127.0.0.1:6379/0")
  ensure
    ENV["REDIS_URL"] = saved
  end

  it "reads the LOCK_MANAGER_* variables the lock_manager command reads, LOCK_MANAGER_REDIS_URL before REDIS_URL" do
    variables = { "LOCK_MANAGER_REDIS_URL" => "redis://127.0.0.1:6391/1", "LOCK_MANAGER_KEY_PREFIX" => "app:",
                  "LOCK_MANAGER_SENTINELS" => "redis://127.0.0.1:26379, redis://127.0.0.1:26380",
                  "LOCK_MANAGER_SENTINEL_MASTER" => "primary" }
    saved = variables.keys.to_h { |name| [name, ENV.fetch(name, nil)] }
    ENV.update(variables)
    config = described_class.new

    expect(config.to_h).to include(redis_url: "redis://127.0.0.1:6391/1", key_prefix: "app:",
                                   sentinels: %w[redis://127.0.0.1:26379 redis://127.0.0.1:26380],
                                   sentinel_master: "primary", cluster: nil)
    expect(config.locker_options).to include(sentinel_master: "primary")
    expect(described_class.environment("LOCK_MANAGER_CLUSTER" => "redis://a:1,redis://b:2", "REDIS_URL" => "redis://c"))
      .to eq(cluster: %w[redis://a:1 redis://b:2], redis_url: "redis://c")
    expect(described_class::ENVIRONMENT.values.flatten).to eq(
      %w[LOCK_MANAGER_REDIS_URL REDIS_URL LOCK_MANAGER_KEY_PREFIX LOCK_MANAGER_CLUSTER LOCK_MANAGER_SENTINELS
         LOCK_MANAGER_SENTINEL_MASTER LOCK_MANAGER_TLS_CA_FILE LOCK_MANAGER_TLS_CERT_FILE LOCK_MANAGER_TLS_KEY_FILE]
    )
  ensure
    saved&.each { |name, value| value ? ENV[name] = value : ENV.delete(name) }
  end

  it "is set through LockManager.configure and shown by LockManager.config" do
    LockManager.configure do |c|
      c.redis_url = "redis://127.0.0.1:6390/2"
      c.pool_size = 9
      c.key_prefix = "app:"
    end

    expect(LockManager.config.pool_size).to eq(9)
    expect(LockManager.config.key_prefix).to eq("app:")
    expect(LockManager.config.redis_url).to eq("redis://127.0.0.1:6390/2")
  end

  it "shows redis_url without its password everywhere" do
    LockManager.configure { |c| c.redis_url = "redis://admin:hunter2@127.0.0.1:6390/0" }

    shown = [LockManager.config.redis_url, LockManager.config.inspect, LockManager.config.to_h.to_s,
             LockManager.locker.inspect, LockManager.locker.settings.to_s]
    shown.each { |text| expect(text).not_to include("hunter2") }
    expect(LockManager.config.redis_url).to eq("redis://admin:REDACTED@127.0.0.1:6390/0")
  end

  it "connects with the password it hides" do
    server = RedisServer.new(password: "hunter2").start
    locker = LockManager::Locker.new(redis_url: server.url)
    expect(locker.nonblocking_lock("k") { :in }.result).to eq(:in)
  ensure
    server&.shutdown
  end
end
