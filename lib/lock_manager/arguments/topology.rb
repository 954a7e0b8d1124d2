# frozen_string_literal: true

module LockManager
  module Arguments
    # The settings that choose a Redis topology (see README, "Redis topologies"), checked like the
    # others before anything reaches Redis.
    module Topology
      MAX_REPLICAS = 1_000

      module_function

      # Sentinel or Cluster node URLs: nil, or a non-empty Array of redis:// or rediss:// URLs.
      # @return [Array<String>, nil] frozen copies
      def redis_urls(urls, name)
        return nil if urls.nil?
        unless urls.is_a?(Array) && !urls.empty?
          raise ArgumentError, "#{name} must be an Array of redis:// URLs (or nil), got #{redact_all(urls).inspect}"
        end

        urls.map { |url| tcp_url(url, name).dup.freeze }.freeze
      end

      def tcp_url(url, name)
        Arguments.redis_url(url, name)
        return url unless url.start_with?("unix:")

        raise ArgumentError, "#{name} takes TCP URLs, not unix sockets: #{Arguments.redact(url).inspect}"
      end

      def optional_name(value, name)
        return nil if value.nil?
        return value if value.is_a?(String) && !value.empty?

        raise ArgumentError, "#{name} must be a non-empty String, got #{value.inspect}"
      end

      def replicas(value, name)
        return value if value.is_a?(Integer) && value >= 0 && value <= MAX_REPLICAS

        raise ArgumentError, "#{name} must be an Integer from 0 to #{MAX_REPLICAS}, got #{value.inspect}"
      end

      # The settings that go together: Sentinel needs its master's name and excludes Cluster.
      def check(settings)
        sentinels, master, cluster = settings.values_at(:sentinels, :sentinel_master, :cluster)
        raise ArgumentError, "sentinels and cluster exclude each other: set one of them" if sentinels && cluster
        raise ArgumentError, "sentinels needs sentinel_master (the name the sentinels monitor)" if sentinels && !master
        raise ArgumentError, "sentinel_master needs sentinels (where to ask for it)" if master && !sentinels

        check_replica_timeout(settings)
      end

      # WAIT for replicas must end before read_timeout gives up on its reply.
      def check_replica_timeout(settings)
        timeout, read_timeout = settings.values_at(:replica_timeout, :read_timeout)
        return unless settings[:min_replicas].to_i.positive? && timeout && read_timeout && timeout >= read_timeout

        raise ArgumentError, "replica_timeout (#{timeout}s) must be shorter than read_timeout (#{read_timeout}s)"
      end

      # The settings as they may be shown: every URL without its password.
      def redacted(settings)
        settings.merge(redis_url: Arguments.redact(settings[:redis_url]), sentinels: redact_all(settings[:sentinels]),
                       cluster: redact_all(settings[:cluster]), ssl_params: Tls.redacted(settings[:ssl_params]))
      end

      # A list of URLs, or what was given instead of one, as it may be shown.
      def redact_all(value)
        return value.map { |url| Arguments.redact(url) } if value.is_a?(Array)

        value.is_a?(String) ? Arguments.redact(value) : value
      end
    end
  end
end
