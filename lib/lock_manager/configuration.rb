# frozen_string_literal: true

require "logger"

module LockManager
  # Settings of the shared Locker (and defaults of every Locker.new).
  class Configuration
    SETTINGS = %i[
      redis_url pool_size pool_timeout key_prefix connect_timeout read_timeout retry_interval fair on_lost renew
      max_hold sentinels sentinel_master cluster min_replicas replica_timeout on_redis_error
      tls_ca_file tls_ca_path tls_cert_file tls_key_file tls_verify ssl_params
    ].freeze

    # The environment variables that settings not configured come from (the first one set, even empty, wins); the
    # `lock_manager` command reads the same. Lists are comma-separated URLs.
    ENVIRONMENT = {
      redis_url: %w[LOCK_MANAGER_REDIS_URL REDIS_URL], key_prefix: %w[LOCK_MANAGER_KEY_PREFIX],
      cluster: %w[LOCK_MANAGER_CLUSTER], sentinels: %w[LOCK_MANAGER_SENTINELS],
      sentinel_master: %w[LOCK_MANAGER_SENTINEL_MASTER], tls_ca_file: %w[LOCK_MANAGER_TLS_CA_FILE],
      tls_cert_file: %w[LOCK_MANAGER_TLS_CERT_FILE], tls_key_file: %w[LOCK_MANAGER_TLS_KEY_FILE]
    }.freeze
    LISTS = %i[cluster sentinels].freeze
    DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"

    # The settings the environment gives (see ENVIRONMENT), as `configure` takes them.
    # @param env [#[]] ENV, or a Hash standing for it
    def self.environment(env = ENV)
      ENVIRONMENT.each_with_object({}) do |(name, variables), settings|
        variable = variables.find { |v| env[v] } or next
        settings[name] = LISTS.include?(name) ? split(env[variable]) : env[variable]
      end
    end

    # "url1, url2" => ["url1", "url2"]
    def self.split(urls)
      urls.to_s.split(",").map(&:strip).reject(&:empty?)
    end

    attr_writer :redis_url, :sentinels, :cluster, :ssl_params
    attr_accessor :pool_size, :pool_timeout, :key_prefix, :connect_timeout, :read_timeout, :retry_interval, :fair,
                  :on_lost, :renew, :max_hold, :logger, :sentinel_master, :min_replicas, :replica_timeout,
                  :on_redis_error, :tls_ca_file, :tls_ca_path, :tls_cert_file, :tls_key_file, :tls_verify

    def initialize
      @redis_url = DEFAULT_REDIS_URL
      @pool_size = 5
      @pool_timeout = 5
      @key_prefix = "lock:"
      @connect_timeout = 1.0
      @read_timeout = 1.0
      @retry_interval = 0.1
      @fair = false # blocking waiters take the lock in arrival order (see Locker#blocking_lock)
      @on_lost = :warn # a lock that expired while its block ran: :warn (log it) or :raise (LockLost)
      @renew = false # keep locks alive while their block runs (see Locker#nonblocking_lock)
      @max_hold = nil # with renew: seconds after which a lock is no longer renewed (nil: no cap)
      @on_redis_error = :raise # Redis unreachable: :raise, :run (the block runs unlocked) or :skip (as if taken)
      @logger = Logger.new($stderr, progname: "lock_manager", level: Logger::WARN)
      topology_defaults
      # TLS (rediss://): tls_ca_file or tls_ca_path (nil: the system's CAs), tls_cert_file and tls_key_file
      # (mutual TLS), or ssl_params as redis-rb takes them, all nil; the server's certificate checked:
      @tls_verify = true
      Configuration.environment.each { |name, value| instance_variable_set("@#{name}", value) }
    end

    def topology_defaults
      @sentinels = nil # Sentinel URLs: the primary of sentinel_master is asked of them
      @sentinel_master = nil
      @cluster = nil # seed node URLs of a Redis Cluster
      @min_replicas = 0 # replicas that must acknowledge an acquisition (WAIT) before it counts
      @replica_timeout = 0.05 # seconds to wait for those acknowledgements
    end
    private :topology_defaults

    # Shown without its password.
    def redis_url
      Arguments.redact(@redis_url)
    end

    # Shown without their passwords.
    def sentinels
      Arguments::Topology.redact_all(@sentinels)
    end

    def cluster
      Arguments::Topology.redact_all(@cluster)
    end

    # Shown without a key object's contents.
    def ssl_params
      Arguments::Tls.redacted(@ssl_params)
    end

    # What Locker.new receives: the real URL, every value checked.
    # @raise [ArgumentError] naming the first bad setting
    def locker_options
      Configuration.check(raw_options)
    end

    # The settings as set, the real URLs among them, not yet checked: Locker.new checks them together with
    # its own options (a Locker's rediss:// URL makes the configured tls_* settings right).
    def raw_options
      SETTINGS.to_h { |name| [name, instance_variable_get("@#{name}")] }
    end

    def to_h
      SETTINGS.to_h { |name| [name, public_send(name)] }
    end

    def inspect
      "#<#{self.class} #{to_h.map { |k, v| "#{k}=#{v.inspect}" }.join(" ")}>"
    end

    # How each setting is checked (see Arguments).
    CHECKS = {
      redis_url: :redis_url, pool_size: :pool_size, pool_timeout: :seconds, key_prefix: :key_prefix,
      connect_timeout: :seconds, read_timeout: :seconds, retry_interval: :seconds, fair: :boolean,
      on_lost: :on_lost, on_redis_error: :on_redis_error, renew: :boolean, max_hold: :optional_seconds,
      replica_timeout: :seconds
    }.transform_values { |check| Arguments.method(check) }.merge(
      { sentinels: :redis_urls, sentinel_master: :optional_name, cluster: :redis_urls, min_replicas: :replicas }
        .transform_values { |check| Arguments::Topology.method(check) },
      { tls_ca_file: :file, tls_ca_path: :directory, tls_cert_file: :file, tls_key_file: :file, tls_verify: :verify,
        ssl_params: :ssl_params }.transform_values { |check| Arguments::Tls.method(check) }
    ).freeze

    # @return [Hash] the same options, checked
    def self.check(options)
      unknown = options.keys - SETTINGS
      raise ArgumentError, "unknown option#{"s" if unknown.size > 1}: #{unknown.join(", ")}" if unknown.any?

      checked = options.to_h { |name, value| [name, CHECKS.fetch(name).call(value, name)] }
      checked.tap do
        Arguments::Topology.check(checked)
        Arguments::Tls.check(checked)
      end
    end
  end
end
