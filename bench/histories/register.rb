# frozen_string_literal: true

require "redis"

module Histories
  # The fenced register the critical sections write to: what "storage that checks fencing tokens"
  # means in docs/guarantees.md, reduced to one compare-and-set per write.
  #
  # It lives on a redis-server of its own that no fault touches: the point is to see what the
  # *lock* lets through, so the register must never be the thing that fails. A Lua script is one
  # atomic step on the server (as a conditional UPDATE is in a database), one round trip on
  # loopback, and needs nothing this machine lacks (SQLite would need a gem Debian does not ship
  # here; a file would need a lock of its own, the thing under test).
  class Register
    # KEYS[1]: the register of one lock key; ARGV[1]: the writer's fencing token (decimal).
    # Keeps the largest token accepted and refuses any token not above it: a section writes once,
    # so an equal token is another holder's, given the same number twice (a failover can). Tokens
    # are compared as decimal strings (length, then bytes), never as Lua's doubles, so a token
    # above 2^53 compares right too.
    # Returns {1 accepted or 0 rejected, the largest token before this write or ""}.
    WRITE = <<~LUA
      local last = redis.call('GET', KEYS[1])
      local token = ARGV[1]
      if last and (#token < #last or (#token == #last and token <= last)) then
        return {0, last}
      end
      redis.call('SET', KEYS[1], token)
      return {1, last or ''}
    LUA

    def initialize(url, namespace)
      @redis = Redis.new(url: url, timeout: 5)
      @namespace = namespace
      @sha = @redis.script(:load, WRITE)
    end

    # @return [Array(Symbol, Integer, nil)] :accepted or :rejected, and the largest token before
    def write(key, token)
      accepted, before = @redis.evalsha(@sha, keys: ["#{@namespace}:#{key}"], argv: [token.to_s])
      [accepted == 1 ? :accepted : :rejected, before.empty? ? nil : Integer(before)]
    end

    def close
      @redis.close
    end
  end
end
