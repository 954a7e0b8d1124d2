# frozen_string_literal: true

require "socket"

# Ports for the servers the suite starts: free on loopback now, below the kernel's ephemeral range (so
# that no connection takes one as its local port between the check and the server's bind), and
# reserved until the server is shut down, so that no other pick hands the same port out meanwhile.
#
# A check alone did not keep a port: a Cluster node's bus port, picked free, is bound only once the
# six nodes start, and another pick of this suite or of the suite running beside it (bin/test runs both
# stacks at once, the Debian 13 one in a chroot that shares the host's network) could take it first:
# "Address already in use" at a node's start. The reservation is an abstract unix socket named after
# the port: Linux keeps one name per network namespace, so every process of every suite on the machine
# sees it, and it goes with the process that holds it, however that process ends.
module FreePort
  # From 16384 to the first ephemeral port (net.ipv4.ip_local_port_range: 32768 by default).
  RANGE = begin
    first_ephemeral = File.read("/proc/sys/net/ipv4/ip_local_port_range").split.first.to_i
    16_384...[first_ephemeral, 20_000].max
  rescue SystemCallError
    16_384...32_768
  end

  @reservations = {}
  @mutex = Mutex.new

  class << self
    # A port free now and reserved for the caller until {release}.
    def pick
      loop do
        port = rand(RANGE)
        return port if reserve(port)
      end
    end

    # Gives a picked port back (its server is shut down for good); a port not picked here is ignored.
    def release(port)
      @mutex.synchronize { @reservations.delete(port)&.close }
    end

    def free?(port)
      TCPServer.new("127.0.0.1", port).close
      true
    rescue SystemCallError
      false
    end

    private

    # A port is reserved when its name is ours (no other process of any suite has it) and nothing
    # that reserves nothing (another program, a connection's local port) is bound to it.
    def reserve(port)
      @mutex.synchronize do
        return false if @reservations.key?(port)

        reservation = Socket.new(:UNIX, :STREAM)
        kept = begin
          reservation.bind(Socket.sockaddr_un("\0lock_manager-spec-port-#{port}"))
          free?(port)
        rescue SystemCallError # reserved by another process
          false
        end
        kept ? @reservations[port] = reservation : reservation.close
        kept
      end
    end
  end
end
