# frozen_string_literal: true

require "json"
require "rbconfig"
require "redis"
require "tmpdir"
require_relative "stack"

# A real `sidekiq` process running an app file against a given Redis: the stack's own Sidekiq, or the
# vendored one SIDEKIQ names (see Stack).
class SidekiqProcess
  attr_reader :log_path

  # @param app [String] the file `sidekiq -r` loads
  # @param env [Hash] REDIS_URL and whatever the app reads
  def initialize(app:, env:, concurrency: 5, shutdown_timeout: 3, queue: "default")
    @app = app
    @env = env
    @queue = queue
    @concurrency = concurrency
    @shutdown_timeout = shutdown_timeout
    @log_path = File.join(Dir.mktmpdir("lock_manager-sidekiq"), "sidekiq.log")
  end

  def start
    command = [*sidekiq_command, "-r", @app, "-q", @queue, "-c", @concurrency.to_s, "-t", @shutdown_timeout.to_s]
    @pid = Process.spawn(@env, *command, out: @log_path, err: %i[child out])
    wait_until_registered(timeout: 30)
    self
  end

  # TERM, as a deploy or Ctrl-C does: Sidekiq stops fetching, waits shutdown_timeout, then
  # interrupts the jobs still running.
  def stop(signal = :TERM, timeout: 20)
    return unless @pid

    Process.kill(signal, @pid)
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout
    until Process.wait(@pid, Process::WNOHANG)
      if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
        Process.kill(:KILL, @pid)
        Process.wait(@pid)
        raise "sidekiq did not stop within #{timeout}s after #{signal}:\n#{log}"
      end
      sleep 0.05
    end
    @pid = nil
  end

  def log
    File.exist?(@log_path) ? File.read(@log_path) : ""
  end

  private

  def sidekiq_command
    Stack.sidekiq_command
  end

  # Ready once its heartbeat lists it in Redis's "processes" set (identity "host:pid:nonce").
  def wait_until_registered(timeout:)
    redis = Redis.new(url: @env.fetch("REDIS_URL"))
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout
    until (identity = redis.smembers("processes").find { |id| id.split(":")[-2] == @pid.to_s })
      raise "sidekiq exited early:\n#{log}" if Process.wait(@pid, Process::WNOHANG)
      if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
        raise "sidekiq did not start within #{timeout}s:\n#{log}"
      end

      sleep 0.05
    end
    check_server_version(redis, identity)
  ensure
    redis&.close
  end

  # Sidekiq 7 and 8 put their version in the heartbeat (6.4 does not): the server must run what
  # SIDEKIQ asked for.
  def check_server_version(redis, identity)
    return unless Stack.sidekiq

    version = JSON.parse(redis.hget(identity, "info"))["version"]
    return if version == Stack.sidekiq

    stop(:KILL)
    raise "SIDEKIQ=#{Stack.sidekiq} but the sidekiq process runs #{version.inspect}:\n#{log}"
  end
end
