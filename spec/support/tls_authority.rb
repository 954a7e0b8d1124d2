# frozen_string_literal: true

require "fileutils"
require "openssl"

# A throwaway certificate authority for the suite's TLS servers and clients, made with Ruby's
# OpenSSL (P-256 keys: quick to make). Each certificate lands in `dir` as NAME.crt and NAME.key.
class TlsAuthority
  attr_reader :dir

  def initialize(dir, name: "lock_manager-test-ca")
    @dir = dir
    FileUtils.mkdir_p(dir)
    @key = OpenSSL::PKey::EC.generate("prime256v1")
    @certificate = certificate(name, @key, issuer: nil, extensions: [%w[basicConstraints CA:TRUE true],
                                                                     %w[keyUsage keyCertSign,cRLSign true]])
    File.write(ca_file, @certificate.to_pem)
  end

  def ca_file
    File.join(dir, "#{@certificate.subject.to_a.dig(0, 1)}.crt")
  end

  # A certificate this authority signs, for a server (its `hosts`: IPs and DNS names) or a client.
  # @param valid [Range<Time>] when it is valid (default: from an hour ago for two days)
  # @return [Array(String, String)] the paths of the certificate and of its key
  def issue(name, hosts: %w[127.0.0.1 localhost], valid: nil)
    key = OpenSSL::PKey::EC.generate("prime256v1")
    alt = hosts.map { |host| host.match?(/\A[\d.:]+\z/) ? "IP:#{host}" : "DNS:#{host}" }.join(",")
    extensions = [%w[basicConstraints CA:FALSE], %w[extendedKeyUsage serverAuth,clientAuth]]
    extensions << ["subjectAltName", alt] unless hosts.empty?
    cert = certificate(name, key, issuer: @certificate, extensions: extensions, valid: valid)
    paths = [File.join(dir, "#{name}.crt"), File.join(dir, "#{name}.key")]
    File.write(paths[0], cert.to_pem)
    File.write(paths[1], key.private_to_pem)
    paths
  end

  private

  def certificate(name, key, issuer:, extensions:, valid: nil)
    valid ||= (Time.now - 3600)..(Time.now + (2 * 86_400))
    cert = OpenSSL::X509::Certificate.new
    cert.version = 2
    cert.serial = OpenSSL::BN.rand(64)
    cert.subject = OpenSSL::X509::Name.new([["CN", name]])
    cert.issuer = issuer ? issuer.subject : cert.subject
    cert.public_key = key
    cert.not_before = valid.begin
    cert.not_after = valid.end
    add_extensions(cert, issuer, extensions)
    cert.sign(issuer ? @key : key, OpenSSL::Digest.new("SHA256"))
  end

  def add_extensions(cert, issuer, extensions)
    factory = OpenSSL::X509::ExtensionFactory.new
    factory.subject_certificate = cert
    factory.issuer_certificate = issuer || cert
    extensions.each { |args| cert.add_extension(factory.create_extension(*args)) }
    cert.add_extension(factory.create_extension("subjectKeyIdentifier", "hash"))
    cert.add_extension(factory.create_extension("authorityKeyIdentifier", "keyid:always")) if issuer
  end
end
