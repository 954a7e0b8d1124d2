# frozen_string_literal: true

require "socket"

module Histories
  # A fault-injecting TCP relay on loopback between one client process and Redis: the partition.
  #
  # #blackhole stops passing bytes either way without closing anything, as a link that drops
  # packets does: the client's sends go nowhere, its reads time out. #resume passes again what
  # was held back, as TCP's retransmissions would deliver it once the link is back (so a command
  # the client gave up on may still reach Redis, late). #reset closes every connection with a
  # RST instead, dropping what was held back; new connections pass again.
  class Proxy
    def initialize(port)
      @port = port
      @listener = TCPServer.new("127.0.0.1", 0)
      @mutex = Mutex.new
      @open = ConditionVariable.new
      @blackholed = false
      @sockets = []
      @threads = [Thread.new { accept }]
    end

    def url
      "redis://127.0.0.1:#{@listener.addr[1]}/0"
    end

    def blackhole
      @mutex.synchronize { @blackholed = true }
    end

    def resume
      @mutex.synchronize do
        @blackholed = false
        @open.broadcast
      end
    end

    # Every connection so far ends with a RST (SO_LINGER 0), then bytes pass again.
    def reset
      sockets = @mutex.synchronize { @sockets.dup.tap { @sockets.clear } }
      sockets.each { |socket| abort_connection(socket) }
      resume
    end

    def close
      @threads.each(&:kill)
      [@listener, *@sockets].each { |socket| socket.close unless socket.closed? }
    end

    private

    def accept
      loop { connect(@listener.accept) }
    rescue IOError, SystemCallError # the listener closed
      nil
    end

    # A client whose Redis cannot be reached is closed, as a refused connection would be.
    def connect(client)
      redis = TCPSocket.new("127.0.0.1", @port)
      @mutex.synchronize { @sockets.push(client, redis) }
      @threads << forward(client, redis) << forward(redis, client)
    rescue SystemCallError
      client.close
    end

    # Copies `from` to `to`; while blackholed, holds what it read (and reads no more).
    def forward(from, to)
      Thread.new do
        loop do
          data = from.readpartial(65_536)
          @mutex.synchronize { @open.wait(@mutex) while @blackholed }
          to.write(data)
        end
      rescue IOError, SystemCallError
        [from, to].each { |socket| socket.close unless socket.closed? }
      end
    end

    def abort_connection(socket)
      socket.setsockopt(Socket::SOL_SOCKET, Socket::SO_LINGER, [1, 0].pack("ii"))
      socket.close
    rescue IOError, SystemCallError
      nil
    end
  end
end
