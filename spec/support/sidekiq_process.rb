# frozen_string_literal: true

require "json"
require "rbconfig"
require "redis"
require "tmpdir"

# A real `sidekiq` process running an app file against a given Redis: Debian's sidekiq 6.4, or
# with SIDEKIQ=7 the vendored 7.3.9 (see SidekiqProcess.select_sidekiq).
class SidekiqProcess
  ROOT = File.expand_path("../..", __dir__)
  # Unmodified upstream sources beside the repository, never copied into it: absent in a user's clone.
  VENDOR = File.expand_path("../shared/vendor", ROOT)
  # What SIDEKIQ=7 loads ahead of Debian's gems and Bundler's (Sidekiq 7 talks to Redis through redis-client).
  VENDORED = { "sidekiq" => "7.3.9", "redis-client" => "0.30.0", "connection_pool" => "2.5.5" }.freeze

  # @return [Boolean] SIDEKIQ=7: the vendored Sidekiq 7.3.9; unset (or 6): the Sidekiq Bundler resolves
  def self.sidekiq7?
    case ENV.fetch("SIDEKIQ", "")
    when "7" then true
    when "", "6" then false
    else raise ArgumentError, "SIDEKIQ=#{ENV.fetch("SIDEKIQ")}: 7 runs the vendored Sidekiq 7.3.9, unset Debian's"
    end
  end

  def self.vendor_libs
    VENDORED.map { |name, version| File.join(VENDOR, "#{name}-#{version}", "lib") }
  end

  # With SIDEKIQ=7, puts the vendored libraries first on the load path, requires Sidekiq and checks
  # what got loaded. Call it before anything requires sidekiq or connection_pool.
  def self.select_sidekiq
    if sidekiq7?
      missing = vendor_libs.reject { |dir| File.directory?(dir) }
      raise "SIDEKIQ=7 needs #{missing.join(", ")}" unless missing.empty?

      $LOAD_PATH.unshift(*(vendor_libs - $LOAD_PATH))
    end
    require "sidekiq"
    check_versions
  end

  # Fails loudly when SIDEKIQ=7 asked for the vendored libraries and others are loaded, even in part.
  def self.check_versions
    return unless sidekiq7?

    loaded = { "sidekiq" => Sidekiq::VERSION, "redis-client" => RedisClient::VERSION,
               "connection_pool" => ConnectionPool::VERSION }
    foreign = $LOADED_FEATURES.grep(%r{/(?:sidekiq|redis-client|connection_pool)-[\d.]+/lib/})
                              .reject { |path| path.start_with?("#{VENDOR}/") }
    return if loaded == VENDORED && foreign.empty?

    raise "SIDEKIQ=7 wants #{VENDORED} from #{VENDOR}; loaded #{loaded}#{", and #{foreign.join(", ")}" if foreign.any?}"
  end

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

  # Debian's `sidekiq`, or the vendored one with the vendored libraries ahead of Debian's gems.
  def sidekiq_command
    return [RbConfig.ruby, Gem.bin_path("sidekiq", "sidekiq")] unless self.class.sidekiq7?

    [RbConfig.ruby, *self.class.vendor_libs.map { |dir| "-I#{dir}" }, "-I#{File.join(ROOT, "lib")}",
     File.join(VENDOR, "sidekiq-#{VENDORED.fetch("sidekiq")}", "bin", "sidekiq")]
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

  # Sidekiq 7 puts its version in the heartbeat (6.4 does not): the server must run what SIDEKIQ asked for.
  def check_server_version(redis, identity)
    return unless self.class.sidekiq7?

    version = JSON.parse(redis.hget(identity, "info"))["version"]
    return if version == VENDORED.fetch("sidekiq")

    stop(:KILL)
    raise "SIDEKIQ=7 but the sidekiq process runs #{version.inspect}:\n#{log}"
  end
end
