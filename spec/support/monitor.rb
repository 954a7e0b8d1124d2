# frozen_string_literal: true

# Records the commands a redis-server runs (MONITOR) while a block runs, with the keys of each.
class CommandRecorder
  # Commands a lock cycle may send, and where their keys are.
  FIRST_ARG_IS_KEY = %w[
    SET GET DEL INCR EXISTS PEXPIRE PEXPIREAT PTTL ZADD ZREM ZRANGE ZCARD ZSCORE ZCOUNT ZRANK
    ZREMRANGEBYSCORE ZRANGEBYSCORE HSET HGET HDEL HVALS HKEYS HLEN
  ].freeze
  NO_KEYS = %w[PUBLISH TIME PING SUBSCRIBE PSUBSCRIBE UNSUBSCRIBE PUNSUBSCRIBE CLIENT CONFIG SELECT HELLO
               INFO].freeze
  Command = Struct.new(:name, :keys, :in_script, keyword_init: true)

  def initialize(url)
    @redis = Redis.new(url: url, timeout: 10)
    @lines = Queue.new
  end

  # @return [Array<Command>] every command the server ran while the block ran, in order
  def record(&block)
    lines_while(&block).filter_map { |line| parse(line) }
  end

  # @return [Array<String>] MONITOR's lines while the block ran, as Redis wrote them
  def lines_while
    ready = Queue.new
    thread = Thread.new do
      @redis.monitor do |line|
        ready << true if line == "OK"
        @lines << line
      end
    rescue IOError, Redis::BaseConnectionError, *(RedisClient::ConnectionError if defined?(RedisClient))
      nil # closed by #lines_while (redis-rb 5 lets redis-client's own error through from MONITOR)
    end
    ready.pop
    yield
    sleep 0.2 # the last commands reach MONITOR
    @redis.close
    thread.join(5)
    Array.new(@lines.size) { @lines.pop }
  end

  private

  # `1700000000.123456 [0 127.0.0.1:5555] "EVALSHA" "sha" "2" "k1" "k2" "arg"`; `[0 lua]` inside scripts.
  def parse(line)
    match = line.match(/\A[\d.]+ \[\d+ ([^\]]+)\] (.*)\z/m) or return
    name, *args = words(match[2])
    name = name.upcase
    Command.new(name: name, keys: keys_of(name, args), in_script: match[1] == "lua")
  end

  def keys_of(name, args)
    return args[2, Integer(args[1])] if %w[EVAL EVALSHA].include?(name)
    return [args[0]] if FIRST_ARG_IS_KEY.include?(name)
    return [] if NO_KEYS.include?(name)

    raise "a lock cycle sent #{name}, which this recorder does not know: add it to a list above"
  end

  ESCAPES = { "n" => "\n", "r" => "\r", "t" => "\t", "a" => "\a", "b" => "\b" }.freeze

  # The quoted words of a MONITOR line, unescaped to their bytes. Redis escapes a quote inside a word
  # (\"); Valkey 8 writes it bare, so a quote ends a word only before ` "` or the end of the line.
  def words(text)
    text.scan(/"((?:[^"\\]|\\.|"(?! "|\z))*)"(?= "|\z)/m).map do |(word)|
      word.gsub(/\\x(\h\h)|\\(.)/m) do
        hex, char = Regexp.last_match.captures
        hex ? hex.hex.chr : ESCAPES.fetch(char, char)
      end.b
    end
  end
end
