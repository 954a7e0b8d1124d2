# frozen_string_literal: true

require "net/http"
require "rbconfig"
require "tmpdir"
require_relative "puma_process"
require_relative "redis_server"

# spec/support/web_app.rb in a Puma process of its own: Sidekiq's Web UI with the Locks tab at
# /sidekiq, on the stack's own Sidekiq or (SIDEKIQ, inherited) a vendored one.
class WebServer
  LIB = File.expand_path("../../lib", __dir__)

  attr_reader :port

  # @param requires [Array<String>] files the app loads too (the job classes whose locks its pages release)
  def initialize(redis_url:, key_prefix:, requires: [])
    @redis_url = redis_url
    @key_prefix = key_prefix
    @requires = requires
    @port = FreePort.pick
    @log_path = File.join(Dir.mktmpdir("lock_manager-web"), "web.log")
  end

  def url(path = "")
    "http://127.0.0.1:#{port}/sidekiq#{path}"
  end

  def start
    @pid = Process.spawn(RbConfig.ruby, "-I#{LIB}", File.join(__dir__, "web_app.rb"), port.to_s, @redis_url,
                         @key_prefix, *@requires, out: @log_path, err: %i[child out])
    wait_until_serving
    self
  end

  # TERM (PumaProcess.stop): a Puma still running 20 s later is killed, and the error carries its log.
  def stop
    return unless @pid

    begin
      PumaProcess.stop(@pid, timeout: 20) { log }
    ensure
      @pid = nil
    end
  end

  def log
    File.exist?(@log_path) ? File.read(@log_path) : ""
  end

  # A request of the spec's own (not the browser's), e.g. a forged POST.
  def post(path, form, cookie: nil)
    uri = URI(url(path))
    request = Net::HTTP::Post.new(uri)
    request.set_form_data(form)
    request["Cookie"] = cookie if cookie
    Net::HTTP.start(uri.host, uri.port) { |http| http.request(request) }
  end

  private

  def wait_until_serving
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 30
    until serving?
      late = Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
      raise "the web app exited:\n#{log}" if Process.wait(@pid, Process::WNOHANG)
      raise "the web app did not serve within 30s:\n#{log}" if late

      sleep 0.1
    end
  end

  def serving?
    Net::HTTP.get_response(URI(url("/locks"))).code == "200"
  rescue SystemCallError, EOFError
    false
  end
end
