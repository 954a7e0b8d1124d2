# frozen_string_literal: true

require "fileutils"
require "net/http"
require "rbconfig"
require "socket"
require "tmpdir"
require_relative "puma_process"
require_relative "redis_server"

# The Rails app of spec/support/web_rails_app (Sidekiq::Web mounted at /sidekiq with the Locks tab),
# copied to a tmp dir (development writes there, and a spec edits its routes) and served by a real Puma
# on a free loopback port, in development or production. Rails is never loaded into the suite's process.
class WebRailsAppServer
  APP = File.expand_path("web_rails_app", __dir__)

  attr_reader :port

  # @param api_only [nil, "1", "bare"] an API-only app, with docs/web.md's session lines or without
  def initialize(environment:, redis_url:, prefix:, api_only: nil)
    @dir = Dir.mktmpdir("lock_manager-web-rails")
    FileUtils.cp_r(APP, app_dir)
    @env = { "RAILS_ENV" => environment, "REDIS_URL" => redis_url, "LOCK_PREFIX" => prefix,
             "RAILS_LOG_PATH" => File.join(@dir, "rails.log"), "API_ONLY" => api_only }
    @port = FreePort.pick
  end

  # Returns once Puma listens: it binds after loading the app, and the first request is the spec's own
  # (a readiness probe through the app's routes would be the first request Rails serves).
  def start(timeout: 60)
    command = PumaProcess.command(port, "--threads", "0:4", "--environment", @env.fetch("RAILS_ENV"))
    @pid = Process.spawn(@env, *command, chdir: app_dir, out: puma_log_path, err: %i[child out])
    deadline = monotonic + timeout
    until listening?
      if Process.wait(@pid, Process::WNOHANG)
        @pid = nil
        raise "puma exited:\n#{log}"
      end
      raise "puma did not listen within #{timeout}s:\n#{log}" if monotonic > deadline

      sleep 0.1
    end
    self
  end

  def shutdown
    PumaProcess.stop(@pid) { log } if @pid
    @pid = nil
  ensure
    FileUtils.rm_rf(@dir)
    FreePort.release(@port)
  end

  # Adds a route to config/routes.rb as a developer would: development reloads the routes at the next
  # request, and then serves GET /edited/:id.
  def edit_routes
    path = File.join(app_dir, "config", "routes.rb")
    edited = %(  get "edited/:id", to: "pages#show"\n)
    routes = File.read(path).sub(%r{^  get "pages/:id".*\n}) { |line| line + edited }
    raise "no pages route in #{path}" unless routes.include?("edited/:id")

    File.write(path, routes) # a later mtime (Rails' FileUpdateChecker ignores one in the future)
  end

  def log
    [puma_log_path, File.join(@dir, "rails.log")].select { |path| File.exist?(path) }.map { |path| File.read(path) }
                                                 .join("\n")
  end

  def get(path, headers = {})
    request(Net::HTTP::Get.new(path, headers))
  end

  def post(path, form, headers = {})
    request(Net::HTTP::Post.new(path, headers).tap { |post| post.set_form_data(form) })
  end

  private

  def request(req)
    Net::HTTP.start("127.0.0.1", port, open_timeout: 5, read_timeout: 30) { |http| http.request(req) }
  end

  def app_dir
    File.join(@dir, "app")
  end

  def puma_log_path
    File.join(@dir, "puma.log")
  end

  def listening?
    Socket.tcp("127.0.0.1", port, connect_timeout: 1).close
    true
  rescue SystemCallError
    false
  end

  def monotonic
    Process.clock_gettime(Process::CLOCK_MONOTONIC)
  end
end
