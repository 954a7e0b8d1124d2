# frozen_string_literal: true

require "fileutils"
require "socket"
require "tmpdir"
require "redis"
require_relative "free_port"
require_relative "stack"

# A real redis-server on a free loopback port, owned by the suite: it may be stopped, paused
# and restarted (on the same port) to inject faults. Nothing is persisted.
class RedisServer
  SETSID = "/usr/bin/setsid"

  attr_reader :port

  # @param tls [Boolean] serve TLS only, with a certificate from a throwaway CA (see #ca_file)
  # @param unix [Boolean] also listen on a unix socket (see #socket)
  # @param own_session [Boolean] run in a session of its own (`setsid`, which execs in place: the
  #   pid stays redis-server's), as a real Redis runs: a service, not a child in its clients'
  #   session. For benchmarks: in the client's session, Linux's autogroup scheduling gives Redis and
  #   every client thread one CPU share, and 8 threads' lock cycles measured 22-30% slower so
  #   (bench/locks.rb, 2026-11-23). Not for the specs: out of the terminal's process group, the
  #   server would outlive a second Ctrl-C.
  def initialize(port: FreePort.pick, password: nil, tls: false, unix: false, own_session: false)
    @port = port
    @password = password
    @tls = tls
    @unix = unix
    @own_session = own_session && File.executable?(SETSID)
    @dir = Dir.mktmpdir("lock_manager-redis")
    make_certificates if tls
  end

  def ca_file
    File.join(@dir, "ca.crt")
  end

  def socket
    File.join(@dir, "redis.sock")
  end

  def url(password: @password)
    scheme = @tls ? "rediss" : "redis"
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
    return Redis.new(url: url, timeout: 2, ssl_params: { ca_file: ca_file }) if @tls

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
    ["--port", "0", "--tls-port", port.to_s, "--tls-cert-file", File.join(@dir, "server.crt"),
     "--tls-key-file", File.join(@dir, "server.key"), "--tls-ca-cert-file", ca_file, "--tls-auth-clients", "no"]
  end

  def make_certificates
    Dir.chdir(@dir) do
      File.write("san.ext", "subjectAltName=IP:127.0.0.1,DNS:localhost\n")
      [%w[req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=lock_manager-test-ca -keyout ca.key -out ca.crt],
       %w[req -newkey rsa:2048 -nodes -subj /CN=127.0.0.1 -keyout server.key -out server.csr],
       %w[x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 -extfile san.ext -out server.crt]]
        .each do |args|
        system("openssl", *args, out: File::NULL,
                                 err: File::NULL) || raise("openssl #{args.first} failed")
      end
    end
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
