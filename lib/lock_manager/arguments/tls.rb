# frozen_string_literal: true

module LockManager
  module Arguments
    # The TLS settings (README, "TLS and ACL"): the files are checked when the settings are, and read into
    # PEM for the extension when a Locker is made. A private key's contents never appear in a message, a log
    # line or #inspect.
    module Tls
      FILES = %i[tls_ca_file tls_cert_file tls_key_file].freeze
      # ssl_params as redis-rb and redis-client take it: the keys understood, and the setting each stands for.
      SSL_PARAMS = { ca_file: :tls_ca_file, ca_path: :tls_ca_path, cert: :tls_cert_file, key: :tls_key_file,
                     verify_mode: :tls_verify }.freeze
      VERIFY_NONE = 0 # OpenSSL::SSL::VERIFY_NONE

      module_function

      # A readable file, or nil.
      def file(path, name)
        return nil if path.nil?
        raise ArgumentError, "#{name} must be a path (String), got #{path.class}" unless path.is_a?(String)
        raise ArgumentError, "#{name}: no such file #{path.inspect}" unless File.file?(path)
        raise ArgumentError, "#{name}: #{path.inspect} is not readable by this process" unless File.readable?(path)

        path
      end

      # A directory of PEM certificates (as OpenSSL's CApath), or nil.
      def directory(path, name)
        return nil if path.nil?
        return path if path.is_a?(String) && File.directory?(path) && File.readable?(path)

        raise ArgumentError, "#{name} must be a readable directory of PEM certificates, got #{path.inspect}"
      end

      def verify(value, name)
        return value if [true, false].include?(value)

        raise ArgumentError, "#{name} must be true (check the server's certificate and name) or false, " \
                             "got #{value.inspect}"
      end

      # redis-rb's and redis-client's ssl_params: files by path, or `cert`/`key` as OpenSSL objects.
      # @return [Hash, nil] with Symbol keys
      def ssl_params(params, name)
        return nil if params.nil?
        raise ArgumentError, "#{name} must be a Hash (ca_file:, cert:, key:, ...)" unless params.is_a?(Hash)

        params = params.transform_keys(&:to_sym)
        unknown = params.keys - SSL_PARAMS.keys
        if unknown.any?
          raise ArgumentError, "#{name} does not take #{unknown.join(", ")} (it takes #{SSL_PARAMS.keys.join(", ")})"
        end

        params.each { |key, value| ssl_param(key, value, "#{name}[:#{key}]") }.freeze
      end

      def ssl_param(key, value, name)
        case key
        when :ca_file then file(value, name)
        when :ca_path then directory(value, name)
        when :verify_mode
          raise ArgumentError, "#{name} must be OpenSSL::SSL::VERIFY_PEER or VERIFY_NONE" unless value.is_a?(Integer)
        else file(value, name) unless openssl_object?(value)
        end
      end

      def openssl_object?(value)
        defined?(OpenSSL::X509::Certificate) &&
          (value.is_a?(OpenSSL::X509::Certificate) || value.is_a?(OpenSSL::PKey::PKey))
      end

      # The settings that go together, and that the files hold what their names say.
      def check(settings)
        Material.read(settings)
        nil
      end

      # ssl_params as it may be shown: a key object replaced.
      def redacted(params)
        return params unless params.is_a?(Hash)

        params.to_h { |key, value| [key, key.to_s == "key" && !value.is_a?(String) ? "REDACTED" : value] }
      end
    end
  end
end
