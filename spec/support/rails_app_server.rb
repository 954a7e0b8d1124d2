# frozen_string_literal: true

require "fileutils"
require "json"
require "net/http"
require "open3"
require "rbconfig"
require "tmpdir"
require_relative "free_port"
require_relative "puma_process"

# The app of spec/support/rails_app run once in a plain `ruby` (no Puma), with a database and log of its own in a
# tmp dir: booted, its own tests, its commands.
module RailsAppCommands
  APP = File.expand_path("rails_app", __dir__)

  # The environment the app reads (RAILS_ENV, database, log), with `extra` on top.
  def env(dir, extra = {})
    { "RAILS_ENV" => "production", "DATABASE_PATH" => File.join(dir, "app.sqlite3"),
      "RAILS_LOG_PATH" => File.join(dir, "rails.log") }.merge(extra)
  end

  # Boots the app and runs `code` after it; for what happens at boot.
  # @return [Array(String, String, Process::Status)] stdout, stderr, status
  def boot(env:, code: "")
    Dir.mktmpdir("lock_manager-rails") do |dir|
      Open3.capture3(env(dir, env), RbConfig.ruby, "-e", "require './config/environment'\n#{code}", chdir: APP)
    end
  end

  # Runs a file of the app's own tests (test/) in RAILS_ENV=test, as `bin/rails test` would.
  # @return [Array(String, Process::Status)] its output (stdout and stderr) and status
  def test(file, env:)
    Dir.mktmpdir("lock_manager-rails") do |dir|
      Open3.capture2e(env(dir, env.merge("RAILS_ENV" => "test")), RbConfig.ruby, "-Itest", file, chdir: APP)
    end
  end

  # Runs bin/rails (a task, a command) in the app.
  # @return [Array(String, String, Process::Status)] stdout, stderr, status
  def rails(*args, env:, stdin: "")
    Dir.mktmpdir("lock_manager-rails") do |dir|
      Open3.capture3(env(dir, env), RbConfig.ruby, "bin/rails", *args, chdir: APP, stdin_data: stdin)
    end
  end

  # The Rails the app runs on (booted once to ask it).
  def rails_version
    @rails_version ||= begin
      out, err, status = boot(env: { "REDIS_URL" => "redis://127.0.0.1:1", "LOCK_PREFIX" => "version:" },
                              code: "print Rails.version")
      raise "the app did not boot:\n#{err}" unless status.success?

      Gem::Version.new(out)
    end
  end
end

# The Rails app of spec/support/rails_app (on the stack's Rails), served by a real Puma on a free loopback port,
# with its own SQLite database and Rails log in a tmp dir. Rails is never loaded into the suite's own process.
class RailsAppServer
  extend RailsAppCommands
  APP = RailsAppCommands::APP

  attr_reader :port, :dir

  # @param workers [Integer] Puma workers (forked from a --preload master); 0: single mode
  def initialize(redis_url:, prefix:, on_redis_error: :raise, workers: 0, threads: 16)
    @env = { "REDIS_URL" => redis_url, "LOCK_PREFIX" => prefix, "ON_REDIS_ERROR" => on_redis_error.to_s,
             "RAILS_MAX_THREADS" => threads.to_s }
    @env["LOCK_AT_BOOT"] = "1" if workers.positive?
    @workers = workers
    @threads = threads
    @port = FreePort.pick
    @dir = Dir.mktmpdir("lock_manager-rails")
  end

  def start(timeout: 60)
    command = PumaProcess.command(port, "--threads", "0:#{@threads}", "--workers", @workers.to_s,
                                  *("--preload" if @workers.positive?), "--environment", "production")
    @pid = Process.spawn(self.class.env(@dir, @env), *command, chdir: APP, out: puma_log_path, err: %i[child out])
    wait_until_up(timeout)
    self
  end

  # TERM, as a deploy does (PumaProcess.stop).
  def stop(timeout: 15)
    return unless @pid

    PumaProcess.stop(@pid, timeout: timeout) { puma_log }
    @pid = nil
  end

  def shutdown
    stop
  ensure
    FileUtils.rm_rf(@dir)
    FreePort.release(@port)
  end

  def rails_log
    File.exist?(File.join(@dir, "rails.log")) ? File.read(File.join(@dir, "rails.log")) : ""
  end

  def puma_log
    File.exist?(puma_log_path) ? File.read(puma_log_path) : ""
  end

  # @return [Array(Integer, Hash)] the status and the JSON body ({} when there is none)
  def post(path, params = {})
    request(Net::HTTP::Post.new(path).tap { |r| r.set_form_data(params) })
  end

  def get(path)
    request(Net::HTTP::Get.new(path))
  end

  private

  def request(req)
    response = Net::HTTP.start("127.0.0.1", port, open_timeout: 5, read_timeout: 30) { |http| http.request(req) }
    body = response.content_type == "application/json" ? JSON.parse(response.body) : {}
    [response.code.to_i, body]
  end

  def puma_log_path
    File.join(@dir, "puma.log")
  end

  def wait_until_up(timeout)
    deadline = monotonic + timeout
    loop do
      if Process.wait(@pid, Process::WNOHANG)
        @pid = nil
        raise "puma exited early:\n#{puma_log}\n#{rails_log}"
      end
      return if up?
      raise "puma did not serve within #{timeout}s:\n#{puma_log}" if monotonic > deadline

      sleep 0.1
    end
  end

  def up?
    Net::HTTP.start("127.0.0.1", port, open_timeout: 1, read_timeout: 5) { |http| http.get("/up") }.code == "200"
  rescue SystemCallError, Net::OpenTimeout, Net::ReadTimeout, EOFError
    false
  end

  def monotonic
    Process.clock_gettime(Process::CLOCK_MONOTONIC)
  end
end
