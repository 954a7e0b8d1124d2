# frozen_string_literal: true

# The seed design ("Build concurrency control in Sidekiq", shared/seeds/000_*) in plain Ruby,
# kept as the article writes it: the baseline bench/locks.rb compares the gem against.
# Changes: everything lives under Baseline, the Locker takes the adapter's options instead of
# being a Singleton, and rubocop's style (quotes, squiggly heredoc, `raise Error, arg`).

require "connection_pool"
require "digest"
require "redis"
require "securerandom"

module Baseline
  # The article's RedisLock::Lock: SET NX PX to lock, compare-and-delete Lua script to unlock.
  class RedisLock
    # One lock attempt or release of `key` (prefixed) holding `value`.
    class Lock
      LOCK_PREFIX = "lock:"

      attr_reader :redis, :key, :value, :expires_in

      def initialize(redis, key:, value:, expires_in: 30)
        @redis = redis
        @key = LOCK_PREFIX + key
        @value = value
        # milliseconds
        @expires_in = expires_in * 1000
      end

      def lock
        reply = redis.set(key, value, nx: true, px: expires_in)
        reply == true
      end

      def unlock
        reply = begin
          redis.evalsha redis_lock_script_sha, keys: [key], argv: [value]
        rescue Redis::CommandError
          redis.eval redis_lock_script, keys: [key], argv: [value]
        end

        reply.to_s == "1"
      end

      private

      def redis_lock_script_sha
        @redis_lock_script_sha ||= Digest::SHA1.hexdigest(redis_lock_script)
      end

      def redis_lock_script
        @redis_lock_script ||= <<~LUA
          if redis.call("get", KEYS[1]) == ARGV[1]
          then
            return redis.call("del", KEYS[1])
          else
            return 0
          end
        LUA
      end
    end
  end

  # The article's LockManager::Adapters::RedisLockAdapter.
  class RedisLockAdapter
    class LockNotAcquired < StandardError; end

    attr_reader :sleep_time

    def initialize(pool_size: 5, pool_timeout: 5, redis: {}, sleep_time: 0.1)
      @connection_pool = ConnectionPool.new(size: pool_size, timeout: pool_timeout) do
        Redis.new(redis)
      end

      @sleep_time = sleep_time
    end

    def unlock(key, value)
      with_redis do |redis|
        RedisLock::Lock.new(redis, key: key, value: value).unlock
      end
    end

    def try_lock(key, value, timeout)
      locked = false
      with_redis do |redis|
        locked = RedisLock::Lock.new(redis, key: key, value: value, expires_in: timeout).lock
        return false if locked == false
      end

      locked
    end

    def lock(key, value, timeout)
      expire = Time.now + timeout.to_f
      locked = false

      loop do
        raise LockNotAcquired, key if Time.now + sleep_time > expire

        with_redis do |redis|
          locked = RedisLock::Lock.new(redis, key: key, value: value, expires_in: timeout).lock
        end

        break if locked == true

        sleep(sleep_time)
      end
    end

    private

    def with_redis(&block)
      @connection_pool.with(&block)
    end
  end

  # The article's LockManager::Locker (instance methods), with its Result class.
  class Locker
    attr_reader :adapter

    # @param adapter_options [Hash] pool_size:, pool_timeout:, redis: (Redis.new options), sleep_time:
    def initialize(**adapter_options)
      @adapter = RedisLockAdapter.new(**adapter_options)
    end

    def nonblocking_lock(key, timeout: 30)
      value = SecureRandom.hex

      if adapter.try_lock(key, value, timeout)
        begin
          Result.new(true, yield)
        ensure
          adapter.unlock(key, value)
        end
      else
        Result.new(false, nil)
      end
    end

    def blocking_lock(key, timeout: 30)
      value = SecureRandom.hex
      adapter.lock(key, value, timeout)
      yield
    ensure
      adapter.unlock(key, value)
    end

    # What nonblocking_lock did: whether the block ran, and its value.
    class Result
      attr_reader :result

      def initialize(run, result = nil)
        @run = run
        @result = result
      end

      def run?
        @run
      end
    end
  end
end
