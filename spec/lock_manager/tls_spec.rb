# frozen_string_literal: true

require "spec_helper"
require "open3"
require "openssl"
require "rbconfig"
require "stringio"

# TLS on Redis's defaults (tls-auth-clients yes: a client certificate required), with a CA made
# here: every path of the gem over it, the settings as users write them, and each way a handshake
# fails. The fault specs (connection_spec) and Sentinel and Cluster (spec/topologies/tls_spec.rb)
# run over TLS too.
RSpec.describe "TLS" do
  before(:context) do
    @authority = TlsAuthority.new(Dir.mktmpdir("lock_manager-tls"))
    @server = RedisServer.new(tls: @authority).start
  end

  after(:context) do
    @server.shutdown
    FileUtils.rm_rf(@authority.dir)
  end

  let(:server) { @server }
  let(:authority) { @authority }
  let(:settings) { server.tls_settings }
  let(:log) { StringIO.new }

  def tls_locker(url: server.url, **options)
    LockManager::Locker.new(redis_url: url, key_prefix: prefix, connect_timeout: 2, **options)
  end

  def expect_tls_error(locker, port: server.port)
    error, took = timed_error(LockManager::TLSError) { locker.blocking_lock("k", wait: 5) { :ran } }
    expect(error).to be_a(LockManager::ConnectionError)
    expect(error.message).to include('"k"', "127.0.0.1:#{port}")
    expect(took).to be < 1.5 # a handshake that failed is not tried again for the whole wait
    expect(error.message).not_to include(File.read(settings[:tls_key_file]).lines[1].strip)
    error.message
  end

  def key_pem
    File.read(settings[:tls_key_file])
  end

  # The settings as the LOCK_MANAGER_TLS_* variables the command line reads.
  def variables
    settings.transform_keys { |name| "LOCK_MANAGER_#{name.upcase}" }
  end

  describe "with a CA and a client certificate of the app's own" do
    it "serves every path: locks, waits woken by a release, fair queues, semaphores, limiters, admin" do
      locker = tls_locker(**settings)
      expect(locker.nonblocking_lock("k") { :tls }.result).to eq(:tls)

      holder = tls_locker(**settings).try_lock("busy", timeout: 10) # another holder, as another process would be
      Thread.new { sleep 0.2; holder.release } # rubocop:disable Style/Semicolon
      waited = elapsed { expect(locker.blocking_lock("busy", wait: 5, fair: true) { :woken }).to eq(:woken) }
      expect(waited).to be_between(0.15, 1.0) # woken by the release (a message over TLS), not by the timeout

      expect(locker.nonblocking_lock("sem", limit: 2) { locker.nonblocking_lock("sem", limit: 2) { :both }.result }
        .result).to eq(:both)
      limiter = LockManager::Limiter.sliding_window("#{prefix}api", 1, per: 60, locker: locker)
      expect([limiter.try_acquire, limiter.try_acquire].map(&:admitted?)).to eq([true, false])
      lock = locker.try_lock("shown", timeout: 30)
      expect(LockManager::Admin.new(locker).locks("shown").map(&:key)).to eq(["shown"])
      expect(server.client.get("#{prefix}shown")).to eq(lock.token)
      lock.release
    end

    it "takes redis-rb's and redis-client's ssl_params: paths, or OpenSSL objects" do
      paths = { ca_file: settings[:tls_ca_file], cert: settings[:tls_cert_file], key: settings[:tls_key_file] }
      objects = paths.merge(cert: OpenSSL::X509::Certificate.new(File.read(paths[:cert])),
                            key: OpenSSL::PKey.read(key_pem))
      [paths, objects, objects.transform_keys(&:to_s)].each do |ssl_params|
        expect(tls_locker(ssl_params: ssl_params).nonblocking_lock("k") { :ok }.result).to eq(:ok)
      end
      locker = tls_locker(ssl_params: objects)
      expect(locker.settings[:ssl_params][:key]).to eq("REDACTED")
      expect(locker.inspect + locker.settings.to_s).not_to include(key_pem.lines[1].strip)
    end

    it "trusts the system's CAs when no tls_ca_file is given (SSL_CERT_FILE here)" do
      client_only = settings.except(:tls_ca_file)
      expect_tls_error(tls_locker(**client_only))
      ENV["SSL_CERT_FILE"] = authority.ca_file
      expect(tls_locker(**client_only).nonblocking_lock("k") { :system }.result).to eq(:system)
    ensure
      ENV.delete("SSL_CERT_FILE")
    end

    it "with LockManager.configure and the LOCK_MANAGER_TLS_* variables the command line reads" do
      LockManager.configure do |c|
        c.redis_url = server.url
        settings.each { |name, value| c.public_send("#{name}=", value) }
      end
      expect(LockManager::Locker.nonblocking_lock("k") { :configured }.result).to eq(:configured)
      expect(LockManager::Configuration.environment(variables)).to eq(settings)
    end
  end

  it "the command line: --tls-* flags, or the LOCK_MANAGER_TLS_* variables" do
    lock = tls_locker(**settings).try_lock("listed", timeout: 30)
    command = [RbConfig.ruby, "-I", File.expand_path("../../lib", __dir__),
               File.expand_path("../../exe/lock_manager", __dir__), "--redis-url", server.url, "--prefix", prefix]
    flags = settings.flat_map { |name, value| ["--#{name.to_s.tr("_", "-")}", value] }
    [[{}, flags], [variables, []]].each do |env, more|
      out, err, status = Open3.capture3(env, *command, *more, "list")
      expect([status.exitstatus, err]).to eq([0, ""])
      expect(out).to include("listed")
    end
    _, err, status = Open3.capture3(*command, "list")
    expect(status.exitstatus).to eq(1)
    expect(err).to include("TLS with Redis at 127.0.0.1:#{server.port}", "set tls_ca_file")
    lock.release
  end

  describe "a failed handshake: LockManager::TLSError (a ConnectionError) naming the server and what to set" do
    it "no client certificate, where Redis requires one" do
      message = expect_tls_error(tls_locker(tls_ca_file: authority.ca_file))
      expect(message).to include("requires a client certificate", "tls_cert_file")
    end

    it "a server certificate of a CA the client does not trust" do
      stranger = TlsAuthority.new(File.join(authority.dir, "stranger"), name: "stranger-ca")
      message = expect_tls_error(tls_locker(**settings, tls_ca_file: stranger.ca_file))
      expect(message).to include("not signed by a CA this client trusts", "tls_ca_file")
    end

    it "a client certificate of a CA the server does not trust" do
      stranger = TlsAuthority.new(File.join(authority.dir, "stranger"), name: "stranger-ca")
      cert, key = stranger.issue("stranger-client")
      message = expect_tls_error(tls_locker(**settings, tls_cert_file: cert, tls_key_file: key))
      expect(message).to include("does not trust this client's certificate")
    end

    it "a server certificate for another name, or expired; an expired client certificate" do
      elsewhere = own_server(tls: authority, server_cert: authority.issue("elsewhere", hosts: %w[elsewhere.example]))
      expect(expect_tls_error(tls_locker(url: elsewhere.url, **settings), port: elsewhere.port))
        .to include("hostname mismatch", "elsewhere.example")

      past = (Time.now - (3 * 86_400))..(Time.now - 86_400)
      expired = own_server(tls: authority, server_cert: authority.issue("expired", valid: past))
      expect(expect_tls_error(tls_locker(url: expired.url, **settings), port: expired.port))
        .to include("server's certificate has expired")

      cert, key = authority.issue("expired-client", valid: past)
      expect(expect_tls_error(tls_locker(**settings, tls_cert_file: cert, tls_key_file: key)))
        .to include("client's certificate has expired")
    end

    it "tls_verify: false connects anyway, and says so once per Locker" do
      LockManager.configure { |c| c.logger = Logger.new(log) }
      elsewhere = own_server(tls: authority, server_cert: authority.issue("elsewhere", hosts: %w[elsewhere.example]))
      unverified = settings.merge(tls_ca_file: nil, tls_verify: false)
      2.times do
        locker = tls_locker(url: elsewhere.url, **unverified)
        2.times { expect(locker.nonblocking_lock("k") { :unverified }.result).to eq(:unverified) }
      end
      expect(log.string.scan("tls_verify: false").size).to eq(2)
      expect(tls_locker(ssl_params: { cert: settings[:tls_cert_file], key: settings[:tls_key_file],
                                      verify_mode: OpenSSL::SSL::VERIFY_NONE }, url: elsewhere.url)
        .nonblocking_lock("k") { :none }.result).to eq(:none)
      expect(log.string.scan("tls_verify: false").size).to eq(3)
    end
  end

  describe "settings checked before anything reaches Redis: ArgumentError naming the setting" do
    def refused(**options)
      expect { tls_locker(**options) }.to raise_error(ArgumentError) do |error|
        expect(error.message).not_to include(key_pem.lines[1].strip)
        return error.message
      end
    end

    it "a file missing, a directory, or one holding no PEM of its kind" do
      expect(refused(**settings, tls_ca_file: "/nowhere/ca.crt")).to include("tls_ca_file", "no such file")
      expect(refused(**settings, tls_cert_file: authority.dir)).to include("tls_cert_file", "no such file")
      expect(refused(**settings, tls_ca_file: settings[:tls_key_file])).to include("tls_ca_file holds no PEM")
      expect(refused(**settings, tls_key_file: settings[:tls_cert_file])).to include("tls_key_file holds no")
      expect(refused(**settings, tls_ca_path: "/nowhere")).to include("tls_ca_path")
    end

    it "a key that is not the certificate's, or one without the other" do
      _, other_key = authority.issue("other")
      expect(refused(**settings, tls_key_file: other_key)).to include("not the private key of tls_cert_file")
      expect(refused(**settings, tls_key_file: nil)).to include("tls_cert_file needs tls_key_file")
      expect(refused(**settings, tls_cert_file: nil)).to include("tls_key_file needs tls_cert_file")
    end

    it "a TLS setting with a redis:// URL, whichever topology" do
      plain = "redis://127.0.0.1:#{server.port}/0"
      expect(refused(url: plain, **settings)).to include("redis_url is not a rediss:// URL")
      expect(refused(url: plain, cluster: [plain], **settings)).to include("cluster is not a rediss://")
      expect(refused(sentinels: [plain], sentinel_master: "m", **settings)).to include("sentinels is not a rediss://")
      expect(refused(url: plain, tls_verify: false)).to include("tls_verify", "rediss://")
    end

    it "ssl_params with a key it does not take, beside tls_* settings, or of the wrong type" do
      expect(refused(ssl_params: { ca_file: authority.ca_file, ciphers: "x" })).to include("does not take ciphers")
      expect(refused(ssl_params: { ca_file: authority.ca_file }, **settings)).to include("exclude each other")
      expect(refused(ssl_params: "ca.crt")).to include("ssl_params must be a Hash")
      expect(refused(**settings, tls_verify: "no")).to include("tls_verify must be true")
      expect(refused(ssl_params: { verify_mode: :none })).to include("VERIFY_NONE")
    end

    it "when configured, not first when a lock is taken" do
      expect { LockManager.configure { |c| c.tls_ca_file = "/nowhere/ca.crt" } }
        .to raise_error(ArgumentError, /tls_ca_file/)
    end
  end
end
