# frozen_string_literal: true

# Admin's listing of a large keyspace: `Admin#locks(pattern, limit: nil)` and `Admin#each_lock(pattern)`
# over 100,000 locks among 150,000 keys, against a plain-Ruby listing of the same locks on redis-rb
# (SCAN MATCH COUNT 1000, then per batch one pipelined round trip of GET and PTTL per key, and the
# holder's token split as the gem splits it), which reads less per lock than Admin does (no waiters,
# no parked jobs). Alternating rounds on one Redis, the median of each.
#
#   bundle exec ruby bench/admin.rb
#
# Starts a throwaway redis-server on a free loopback port unless REDIS_URL is set (its keys under
# "bench-admin:" are written, then deleted). ROUNDS (default 3) rounds of each.
#
# The target (docs/admin.md): 100,000 locks listed in under 5 s on the suite's 2-core machine.

require "redis"
require_relative "support"

LOCKS = 100_000
OTHERS = 50_000 # keys the pattern must skip: SCAN visits them all the same
ROUNDS = Integer(ENV.fetch("ROUNDS", "3"))
TARGET = 5.0 # seconds, at most, for the 100,000 locks
PREFIX = "bench-admin:"

FILL = "for i = 1, tonumber(ARGV[2]) do redis.call('SET', ARGV[1] .. i, ARGV[3] .. " \
       "string.format('%016x', i), 'PX', 600000) end"
CLEAR = "for i = 1, tonumber(ARGV[2]) do redis.call('DEL', ARGV[1] .. i) end"

class BenchBug < StandardError; end

# The plain-Ruby listing: each lock's key, holder (host, pid, thread) and milliseconds left.
def baseline(redis, pattern)
  locks = []
  redis.scan_each(match: pattern, count: 1000).each_slice(1000) do |keys|
    replies = redis.pipelined do |pipe|
      keys.each do |key|
        pipe.get(key)
        pipe.pttl(key)
      end
    end
    keys.zip(replies.each_slice(2)) do |key, (token, ttl)|
      host, pid, thread = token.split("/", 4)
      locks << [key.delete_prefix(PREFIX), host, Integer(pid), Integer(thread), ttl]
    end
  end
  locks.sort_by!(&:first)
end

# @return [Float] the seconds the block took
def timed
  start = Bench.now
  count = yield
  raise BenchBug, "listed #{count} locks, not #{LOCKS}" unless count == LOCKS

  Bench.now - start
end

url = Bench.redis_url
redis = Redis.new(url: url)
locker = LockManager::Locker.new(redis_url: url, key_prefix: PREFIX)
admin = LockManager::Admin.new(locker)
begin
  probe = locker.try_lock("host") # its token names this host as every token does
  host = probe.token.split("/").first
  probe.release
  token = "#{host}/4242/4243/#{(Time.now.to_f * 1000).to_i}/"
  Bench.header(url)
  redis.eval(FILL, argv: ["#{PREFIX}bulk:", LOCKS, token])
  redis.eval(FILL, argv: ["#{PREFIX}other:", OTHERS, token])
  puts "#{LOCKS} locks among #{LOCKS + OTHERS} keys, #{ROUNDS} alternating rounds, medians", ""

  listings = {
    "Admin#locks(limit: nil)" => -> { admin.locks("bulk:*", limit: nil).size },
    "Admin#each_lock" => -> { admin.each_lock("bulk:*").count },
    "baseline (redis-rb)" => -> { baseline(redis, "#{PREFIX}bulk:*").size }
  }
  times = Hash.new { |hash, name| hash[name] = [] }
  ROUNDS.times do |round|
    order = round.even? ? listings : listings.reverse_each
    order.each do |name, listing|
      GC.start
      times[name] << timed(&listing)
    end
  end

  base = Bench.percentile(times.fetch("baseline (redis-rb)"), 0.5)
  times.each do |name, seconds|
    median = Bench.percentile(seconds, 0.5)
    verdict = name.start_with?("Admin") ? ", #{Bench.verdict(median, TARGET)} (<= #{TARGET} s)" : ""
    puts format("%<name>-26s %<median>6.2f s  %<ratio>5.2fx the baseline%<verdict>s",
                name: name, median: median, ratio: median / base, verdict: verdict)
  end
ensure
  redis.eval(CLEAR, argv: ["#{PREFIX}bulk:", LOCKS])
  redis.eval(CLEAR, argv: ["#{PREFIX}other:", OTHERS])
end
