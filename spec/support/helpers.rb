# frozen_string_literal: true

require "socket"

# Shared helpers: every example gets its own key prefix, so examples never see each other's locks.
module SpecHelpers
  include KeySlots
  # A lock's token: host/pid/thread/since (ms)/random, and /N for a limit: N semaphore (see token.rs).
  TOKEN = %r{\A[A-Za-z0-9._-]+/\d+/\d+/\d+/\h{16}(/\d+)?\z}

  def prefix
    @prefix ||= "spec:#{SecureRandom.hex(4)}:"
  end

  def redis_url
    ENV.fetch("REDIS_URL")
  end

  # A redis-rb client on the suite's Redis, to look at what the gem wrote.
  def redis
    @redis ||= Redis.new(url: redis_url, timeout: 2)
  end

  # The keys matching `pattern` (a key prefix and "*"), and the internal keys (queues, waiters) of
  # the locks it matches; not the fencing counters, which live on by design.
  def held_keys(client, pattern)
    internal = pattern.end_with?("*") ? client.keys("lock_manager:*:#{pattern}") : []
    (client.keys(pattern) + internal).reject { |key| KeySlots.fencing_counter?(key) }
  end

  # A redis-server of this example's own (`kind`: RedisServer or a subclass), shut down after it.
  def own_server(kind = RedisServer, start: :start, **options)
    kind.new(**options).public_send(start).tap { |server| (@own_servers ||= []) << server }
  end

  def shutdown_own_servers
    (@own_servers || []).each(&:shutdown)
  end

  def new_locker(**options)
    LockManager::Locker.new(redis_url: redis_url, key_prefix: prefix, **options)
  end

  # Another Locker on the same keys: a holder elsewhere, as another process would be. (A thread
  # asking again through the Locker it holds a lock with gets AlreadyHeld, not "held".)
  def elsewhere
    @elsewhere ||= new_locker
  end

  def monotonic
    Process.clock_gettime(Process::CLOCK_MONOTONIC)
  end

  # This machine's name as a lock's token carries it (ext/lock_manager/src/token.rs), worked out apart
  # from the gem to check what it writes.
  def token_host
    Socket.gethostname.b.gsub(/[^A-Za-z0-9._-]/n, "_")[0, 64]
  end

  def elapsed
    started = monotonic
    yield
    monotonic - started
  end

  # @return [Array(Exception, Float)] the error the block raised (it must raise `error_class`)
  #   and how long it took to raise it
  def timed_error(error_class)
    started = monotonic
    yield
    raise "expected #{error_class}, nothing was raised"
  rescue error_class => e
    [e, monotonic - started]
  end

  # Waits (bounded) until the block is truthy.
  def eventually(timeout: 5, interval: 0.01)
    deadline = monotonic + timeout
    loop do
      value = yield
      return value if value
      raise "condition not met within #{timeout}s" if monotonic > deadline

      sleep interval
    end
  end

  # Back to default settings (REDIS_URL) and no shared Locker, as in a fresh process.
  def reset_lock_manager!
    LockManager.instance_variable_set(:@config, LockManager::Configuration.new)
    LockManager.instance_variable_set(:@locker, nil)
  end

  # Points the shared Locker (LockManager::Locker.nonblocking_lock & co.) at the suite's Redis (or `url`),
  # under this example's prefix (or `key_prefix`).
  def configure_shared_locker!(url = redis_url, key_prefix: prefix)
    LockManager.configure do |c|
      c.redis_url = url
      c.key_prefix = key_prefix
    end
  end

  # A Redis that is not listening: anything reaching it fails with ConnectionError.
  def closed_url
    "redis://127.0.0.1:#{FreePort.pick}/0"
  end
end
