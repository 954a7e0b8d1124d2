# frozen_string_literal: true

require "socket"

# A TCP relay to a redis-server that counts round trips (the times a client sent commands after
# replies had reached it) and can hold replies back: then all the commands of a pipeline leave
# before its first reply comes back, and a pipeline counts once.
class SlowLink
  def initialize(port)
    @port = port
    @listener = TCPServer.new("127.0.0.1", 0)
    @mutex = Mutex.new
    @round_trips = 0
    @delay = 0
    @slow_round_trips = 0
    @sockets = []
    @threads = [Thread.new { accept }]
  end

  def url
    "redis://127.0.0.1:#{@listener.addr[1]}/0"
  end

  # Counts from zero, and holds replies back `seconds` for the next `round_trips` round trips (a
  # client that took a round trip per command still ends soon, and is counted).
  def slow_down(seconds, round_trips: 3)
    @mutex.synchronize do
      @round_trips = 0
      @delay = seconds
      @slow_round_trips = round_trips
    end
  end

  def round_trips
    @mutex.synchronize { @round_trips }
  end

  def close
    @threads.each(&:kill)
    [@listener, *@sockets].each(&:close)
  end

  private

  def accept
    loop do
      client = @listener.accept
      redis = TCPSocket.new("127.0.0.1", @port)
      @sockets.push(client, redis)
      relay(client, redis)
    end
  rescue IOError, SystemCallError
    nil
  end

  def relay(client, redis)
    answered = [true] # whether replies reached the client since it last sent
    replies = Queue.new
    @threads << forward(client) do |data|
      @mutex.synchronize do
        @round_trips += 1 if answered[0]
        answered[0] = false
      end
      redis.write(data)
    end
    @threads << forward(redis) { |data| replies << [now + delay, data] }
    @threads << Thread.new { deliver(replies, client, answered) }
  end

  def delay
    @mutex.synchronize { @round_trips <= @slow_round_trips ? @delay : 0 }
  end

  def deliver(replies, client, answered)
    loop do
      due, data = replies.pop
      sleep([due - now, 0].max)
      @mutex.synchronize { answered[0] = true } # before the client can read them, and send again
      client.write(data)
    end
  rescue IOError, SystemCallError
    nil
  end

  def forward(from)
    Thread.new do
      loop { yield from.readpartial(65_536) }
    rescue IOError, SystemCallError
      nil
    end
  end

  def now
    Process.clock_gettime(Process::CLOCK_MONOTONIC)
  end
end
