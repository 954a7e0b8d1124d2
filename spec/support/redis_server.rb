# frozen_string_literal: true

require "fileutils"
require "socket"
require "tmpdir"
require "redis"
require_relative "free_port"
require_relative "stack"
require_relative "tls_authority"

# A real redis-server on a free loopback port, owned by the suite: it may be stopped, paused
# and restarted (on the same port) to inject faults. Nothing is persisted.
class RedisServer
  SETSID = "/usr/bin/setsid"

  attr_reader :port, :authority

  # @param tls [Boolean, TlsAuthority] serve TLS only, on Redis's defaults (a client certificate
  #   required), with certificates of a throwaway CA of its own or of the one given (see #tls_settings)
  # @param server_cert [Array(String, String), nil] another certificate and key to serve
  # @param unix [Boolean] also listen on a unix socket (see #socket)
  # @param own_session [Boolean] run in a session of its own (`setsid`, which execs in place: the
  #   pid stays redis-server's), as a real Redis runs: a service, not a child in its clients'
  #   session. For benchmarks: in the client's session, Linux's autogroup scheduling gives Redis and
  #   every client thread one CPU share, and 8 threads' lock cycles measured 22-30% slower so
  #   (bench/locks.rb, 2026-11-23). Not for the specs: out of the terminal's process group, the
  #   server would outlive a second Ctrl-C.
  def initialize(port: FreePort.pick, password: nil, tls: false, server_cert: nil, unix: false, own_session: false)
    @port = port
    @password = password
    @tls = tls
    @unix = unix
    @own_session = own_session && File.executable?(SETSID)
    @dir = Dir.mktmpdir("lock_manager-redis")
    make_certificates(server_cert) if tls
  end

  def ca_file
    @authority.ca_file
  end

  # The settings of a Locker that talks to this server over TLS, with the client certificate.
  def tls_settings
    { tls_ca_file: ca_file, tls_cert_file: @client_cert[0], tls_key_file: @client_cert[1] }
  end

  def socket
    File.join(@dir, "redis.sock")
  end

  # "rediss" for a TLS server, else "redis".
  def scheme
    @tls ? "rediss" : "redis"
  end

  def url(password: @password)
    password ? "#{scheme}://:#{password}@127.0.0.1:#{port}/0" : "#{scheme}://127.0.0.1:#{port}/0"
  end

  def start
    args = [Stack.redis_server, *base_arguments]
    args += ["--requirepass", @password] if @password
    args += ["--unixsocket", socket] if @unix
    args += tls_arguments if @tls
    args.unshift(SETSID) if @own_session
    @pid = Process.spawn(*args, out: File::NULL, err: File::NULL)
    wait_until_ready
    self
  rescue Errno::ENOENT
    raise "#{Stack.redis_server} is not on PATH: bin/test installs it (apt-get install #{Stack.redis_server})"
  end

  def stop
    return unless @pid

    Process.kill(:KILL, @pid)
    Process.wait(@pid)
    @pid = nil
  end

  def restart
    stop
    start
  end

  def pause
    Process.kill(:STOP, @pid)
  end

  def resume
    Process.kill(:CONT, @pid)
  end

  def shutdown
    stop
    FileUtils.rm_rf(@dir)
    FreePort.release(port)
  end

  # A plain redis-rb client, for looking at what the gem wrote.
  def client
    if @tls
      cert, key = @client_cert.map { |path| File.read(path) }
      ssl_params = { ca_file: ca_file, cert: OpenSSL::X509::Certificate.new(cert), key: OpenSSL::PKey.read(key) }
      # A certificate given to the server may be one made to fail checks: this client only looks.
      ssl_params[:verify_mode] = OpenSSL::SSL::VERIFY_NONE if @own_cert
      return Redis.new(url: url, timeout: 2, ssl_params: ssl_params)
    end

    Redis.new(url: url, timeout: 2)
  end

  private

  # What every redis-server of the suite starts with: loopback only, no snapshots, its log in its
  # directory, and a replica's full sync at once rather than after Redis's default 5 s.
  def base_arguments(persistence: %w[--appendonly no])
    ["--port", port.to_s, "--bind", "127.0.0.1", "--save", "", *persistence, "--dir", @dir,
     "--logfile", File.join(@dir, "redis.log"), "--repl-diskless-sync-delay", "0"]
  end

  def tls_arguments
    ["--port", "0", "--tls-port", port.to_s, "--tls-cert-file", @server_cert[0], "--tls-key-file", @server_cert[1],
     "--tls-ca-cert-file", ca_file]
  end

  def make_certificates(server_cert)
    @authority = @tls.is_a?(TlsAuthority) ? @tls : TlsAuthority.new(File.join(@dir, "tls"))
    @own_cert = !server_cert.nil?
    @server_cert = server_cert || @authority.issue("server-#{port}")
    @client_cert = @authority.issue("client-#{port}")
  end

  def wait_until_ready
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 10
    begin
      client.tap(&:ping).close
    rescue Redis::BaseConnectionError, Redis::CommandError
      raise "redis-server did not start on port #{port}" if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline

      sleep 0.02
      retry
    end
  end
end
