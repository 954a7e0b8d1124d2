# frozen_string_literal: true

module LockManager
  module Arguments
    module Tls
      # The TLS settings read into what the extension receives: PEM, checked with OpenSSL (which is
      # loaded only where a TLS setting is given).
      module Material
        # Logged once per Locker whose tls_verify is false.
        UNVERIFIED = "TLS without verification (tls_verify: false): the server's certificate is not checked, so " \
                     "anyone on the way to Redis can pose as it"

        module_function

        # What the extension receives: nil when no TLS setting is given, else the PEM of the CA (nil: the
        # system's), of the client certificate and its key, and whether to check the server's certificate.
        # @raise [ArgumentError] naming the setting at fault
        def read(settings)
          tls = given(settings) or return nil
          require "openssl"
          need_rediss(settings, settings[:ssl_params] ? :ssl_params : tls.keys.first)
          cert, key = client_pair(tls)
          { ca: ca(tls), cert: cert, key: key, verify: tls.fetch(:tls_verify, true) }
        end

        # The TLS settings given, ssl_params read as the tls_* settings it stands for.
        def given(settings)
          tls = settings.slice(*Tls::FILES, :tls_ca_path).compact
          tls[:tls_verify] = false if settings[:tls_verify] == false
          params = settings[:ssl_params] or return tls.empty? ? nil : tls
          raise ArgumentError, "ssl_params and #{tls.keys.first} exclude each other: set one of them" if tls.any?

          params.to_h do |key, value|
            [Tls::SSL_PARAMS.fetch(key), key == :verify_mode ? value != Tls::VERIFY_NONE : value]
          end
        end

        # A tls_* setting makes sense only where the connections are TLS ones.
        def need_rediss(settings, setting)
          urls = { redis_url: [settings[:redis_url]] }
          urls = { cluster: settings[:cluster] } if settings[:cluster]
          urls[:sentinels] = settings[:sentinels] if settings[:sentinels]
          urls.each do |name, list|
            plain = list.compact.find { |url| !url.start_with?("rediss://") } or next
            raise ArgumentError, "#{setting} is set, but #{name} is not a rediss:// URL (TLS needs rediss://): " \
                                 "#{Arguments.redact(plain).inspect}"
          end
        end

        def ca(tls)
          files = [tls[:tls_ca_file], *directory_files(tls[:tls_ca_path])].compact
          return nil if files.empty?

          pems = files.filter_map { |path| certificates(path) }
          raise ArgumentError, "#{ca_setting(tls)} holds no PEM certificate: #{files.first.inspect}" if pems.empty?

          pems.join
        end

        # The files of an OpenSSL CApath directory, in order.
        def directory_files(directory)
          return [] unless directory

          Dir.children(directory).sort.map { |name| File.join(directory, name) }.select { |path| File.file?(path) }
        end

        def ca_setting(tls)
          tls[:tls_ca_file] ? :tls_ca_file : :tls_ca_path
        end

        # The PEM certificates in `path`, or nil when it holds none.
        def certificates(path)
          found = OpenSSL::X509::Certificate.load(File.binread(path))
          found.empty? ? nil : found.map(&:to_pem).join
        rescue OpenSSL::X509::CertificateError
          nil
        end

        # [certificate chain PEM, key PEM], or [nil, nil] when neither is given.
        def client_pair(tls)
          cert, key = tls.values_at(:tls_cert_file, :tls_key_file)
          return [nil, nil] unless cert || key
          raise ArgumentError, "tls_cert_file needs tls_key_file (its private key)" unless key
          raise ArgumentError, "tls_key_file needs tls_cert_file (its certificate)" unless cert

          certificate, chain = client_certificate(cert)
          private_key = private_key(key)
          unless certificate.check_private_key(private_key)
            raise ArgumentError, "tls_key_file is not the private key of tls_cert_file's certificate " \
                                 "(#{certificate.subject})"
          end

          [chain, private_key.private_to_pem]
        end

        # The certificate and the PEM of its chain.
        def client_certificate(cert)
          return [cert, cert.to_pem] if cert.is_a?(OpenSSL::X509::Certificate)

          chain = certificates(cert) or raise ArgumentError, "tls_cert_file holds no PEM certificate: #{cert.inspect}"
          [OpenSSL::X509::Certificate.new(chain), chain]
        end

        def private_key(key)
          return key if key.is_a?(OpenSSL::PKey::PKey)

          # The empty passphrase keeps OpenSSL from asking for one on a terminal.
          OpenSSL::PKey.read(File.binread(key), "")
        rescue OpenSSL::PKey::PKeyError
          raise ArgumentError, "tls_key_file holds no unencrypted PEM private key: #{key.inspect}"
        end
      end
    end
  end
end
