# frozen_string_literal: true

require "rbconfig"
require "redis"
require "tmpdir"

# A real `sidekiq` process (Debian's sidekiq 6.4) running an app file against a given Redis.
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
    command = [RbConfig.ruby, Gem.bin_path("sidekiq", "sidekiq"), "-r", @app, "-q", @queue,
               "-c", @concurrency.to_s, "-t", @shutdown_timeout.to_s]
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

  # Ready once its heartbeat lists it in Redis's "processes" set (identity "host:pid:nonce").
  def wait_until_registered(timeout:)
    redis = Redis.new(url: @env.fetch("REDIS_URL"))
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout
    until redis.smembers("processes").any? { |identity| identity.split(":")[-2] == @pid.to_s }
      raise "sidekiq exited early:\n#{log}" if Process.wait(@pid, Process::WNOHANG)
      if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
        raise "sidekiq did not start within #{timeout}s:\n#{log}"
      end

      sleep 0.05
    end
  ensure
    redis&.close
  end
end
