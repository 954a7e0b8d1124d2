# frozen_string_literal: true

# Soak: many contenders on ONE key for a while, checking what must never happen rather than
# measuring speed. A script, not a test.
#
#   bundle exec ruby bench/soak.rb [seconds]     (default 60)
#
# Always starts its own redis-server on a free loopback port (REDIS_URL is ignored: the
# connection checks below need a Redis that nobody else uses).
#
# 4 forked processes x 4 threads loop on blocking_lock(KEY, timeout: 5) with a critical section
# of 0-2 ms. The four threads of a process cover every mix: plain, fair: true, renew: true, and
# both. Process 0 also takes every 5th turn with nonblocking_lock. Inside its block, each holder
# marks its entry in Redis with one Lua script: INCR soak:inside (it must become 1, else an
# overlap) and compares its fencing token with soak:last_token (it must be higher, else an
# out-of-order token; the higher one is kept); on leaving, DECR soak:inside.
#
# At the end, one line: acquisitions, blocking_lock's wait (call to block entry, p50/p99),
# overlaps, out-of-order fencing tokens, leaked locks (the lock key, its queue or its waiters
# still there once every process is done; the fencing counters stay by design), leaked
# connections (per process: pooled connections not idle, or connections of the process that the
# pool does not account for; then any connection of a finished process still on the server),
# unfinished processes (hung or crashed), and errors (every exception, with the first message).
# Exits 1 when overlaps, out-of-order tokens, leaked locks, leaked connections or unfinished
# processes are not 0. Details of a failure go to stderr.

require "set"
require_relative "support"

SECONDS = Float(ARGV.fetch(0, "60"))
PROCESSES = 4
THREADS = 4
TIMEOUT = 5                 # each lock's validity, and blocking_lock's longest wait
MAX_HOLD = 0.002            # the critical section sleeps rand * MAX_HOLD
NONBLOCKING_EVERY = 5       # process 0 takes every 5th turn with nonblocking_lock
OPTIONS = [{ fair: false, renew: false }, { fair: true, renew: false }, # by thread index
           { fair: false, renew: true }, { fair: true, renew: true }].freeze
GRACE = TIMEOUT + 30 # how long after the end a process may take to finish before it counts as hung
PREFIX = "soak:lock:"
KEY = "one"
LOCK_KEYS = ["#{PREFIX}#{KEY}", KeySlots.queue_key("#{PREFIX}#{KEY}"), KeySlots.waiters_key("#{PREFIX}#{KEY}")].freeze
INSIDE = "soak:inside"
MARKS = [INSIDE, "soak:last_token", "soak:entries", "soak:overlaps", "soak:out_of_order", "soak:holder",
         "soak:first_problem"].freeze

# A holder's entry, atomically. KEYS: MARKS; ARGV: fencing token (decimal), holder name.
# Tokens are compared as decimal strings (length, then bytes), never as Lua's doubles.
ENTER = <<~LUA
  local inside = redis.call('INCR', KEYS[1])
  redis.call('INCR', KEYS[3])
  local token, holder = ARGV[1], ARGV[2]
  if inside ~= 1 then
    redis.call('INCR', KEYS[4])
    redis.call('SETNX', KEYS[7], 'overlap: ' .. holder .. ' (token ' .. token .. ') entered while ' ..
      tostring(redis.call('GET', KEYS[6])) .. ' was inside (inside=' .. inside .. ')')
  end
  local last = redis.call('GET', KEYS[2])
  if last and (#token < #last or (#token == #last and token <= last)) then
    redis.call('INCR', KEYS[5])
    redis.call('SETNX', KEYS[7], 'out-of-order token: ' .. holder .. ' entered with ' .. token ..
      ' after ' .. last)
  else
    redis.call('SET', KEYS[2], token)
  end
  redis.call('SET', KEYS[6], holder .. ' (token ' .. token .. ')')
  return inside
LUA

# What one thread (then one process, then the run) saw.
Stats = Struct.new(:blocking, :waits, :nonblocking_tries, :nonblocking_runs, :lost, :errors, :first_error,
                   :finished, :leaked_connections, :connection_problems, keyword_init: true) do
  def self.empty
    new(blocking: 0, waits: [], nonblocking_tries: 0, nonblocking_runs: 0, lost: 0, errors: 0, first_error: nil,
        finished: 0.0, leaked_connections: 0, connection_problems: [])
  end

  def error(exception)
    self.errors += 1
    self.first_error ||= "#{exception.class}: #{exception.message}"
  end

  def merge(other)
    Stats.new(**to_h.merge(other.to_h) do |name, mine, theirs|
      case name
      when :first_error then mine || theirs
      when :finished then [mine, theirs].max
      else mine + theirs
      end
    end)
  end
end

# One thread's turns at KEY, from `start_at` until `deadline` (monotonic: the same in every process).
class Contender
  def initialize(locker, marks, enter_sha, process:, thread:)
    @locker = locker
    @marks = marks
    @enter_sha = enter_sha
    @holder = "p#{process}t#{thread}"
    @options = { timeout: TIMEOUT, **OPTIONS.fetch(thread) }
    @nonblocking = process.zero?
    @stats = Stats.empty
  end

  # @return [Stats]
  def run(start_at, deadline)
    sleep([start_at - Bench.now, 0].max)
    turn = 0
    while Bench.now < deadline
      turn += 1
      begin
        @nonblocking && (turn % NONBLOCKING_EVERY).zero? ? nonblocking : blocking
      rescue StandardError => e
        @stats.error(e)
      end
    end
    @stats.finished = Bench.now
    @stats
  end

  private

  def blocking
    called = Bench.now
    entered = result = nil
    @locker.blocking_lock(KEY, **@options) do |lock|
      entered = Bench.now
      result = lock
      critical(lock)
    end
    @stats.blocking += 1
    @stats.waits << (entered - called)
    @stats.lost += 1 if result.lost?
  end

  def nonblocking
    @stats.nonblocking_tries += 1
    result = @locker.nonblocking_lock(KEY, timeout: TIMEOUT) { |lock| critical(lock) }
    return unless result.run?

    @stats.nonblocking_runs += 1
    @stats.lost += 1 if result.lost?
  end

  def critical(lock)
    token = lock.fencing_token
    raise "#{@holder}: the block got no fencing token (#{lock.inspect})" unless token.is_a?(Integer)

    @marks.evalsha(@enter_sha, keys: MARKS, argv: [token.to_s, @holder])
    begin
      sleep(rand * MAX_HOLD)
    ensure
      @marks.decr(INSIDE)
    end
  end
end

# The local ports of this process's TCP connections to `port` (Linux: /proc).
def own_local_ports(port)
  inodes = own_socket_inodes
  remote = format(":%04X", port)
  files = %w[/proc/net/tcp /proc/net/tcp6].select { |file| File.exist?(file) }
  lines = files.flat_map { |file| File.readlines(file).drop(1) }
  lines.map(&:split).filter_map do |fields|
    fields[1].split(":").last.to_i(16) if fields[2].end_with?(remote) && inodes.include?(fields[9])
  end.to_set
end

def own_socket_inodes
  Dir.glob("/proc/self/fd/*").filter_map do |fd|
    File.readlink(fd)[/\Asocket:\[(\d+)\]\z/, 1]
  rescue SystemCallError
    nil
  end.to_set
end

# This process's connections, as the server sees them: every pooled one idle, and none that the
# pool, the one subscriber connection or `marks` do not account for.
# @return [Array(Integer, Array<String>)] how many leaked, and what was wrong
def connection_check(locker, marks, port)
  open, idle = locker.pool_state
  mine = own_local_ports(port)
  marks_id = marks.client(:id)
  clients = marks.client(:list).select { |c| mine.include?(c["addr"].split(":").last.to_i) }
  subscribers, pooled = clients.reject { |c| c["id"].to_i == marks_id }.partition { |c| c["psub"].to_i.positive? }
  problems = []
  problems << "pool_state open #{open}, idle #{idle}" if open != idle
  problems << "#{pooled.size} plain connections on the server, pool_state open #{open}" if pooled.size != open
  problems << "#{subscribers.size} subscriber connections" if subscribers.size > 1
  [(open - idle) + (pooled.size - open).abs + [subscribers.size - 1, 0].max, problems]
end

def child_work(url, port, process, start_at, deadline)
  locker = LockManager::Locker.new(redis_url: url, key_prefix: PREFIX, pool_size: THREADS)
  marks = Redis.new(url: url, timeout: 5)
  sha = marks.script(:load, ENTER)
  stats = Array.new(THREADS) do |thread|
    contender = Contender.new(locker, marks, sha, process: process, thread: thread)
    Thread.new { contender.run(start_at, deadline) }
  end.map(&:value).reduce(:merge)
  stats.leaked_connections, problems = connection_check(locker, marks, port)
  stats.connection_problems = problems.map { |problem| "process #{process}: #{problem}" }
  stats
end

# Forks process `process`, which sends its Stats (or the exception that stopped it) through a pipe.
# @return [Array(Integer, IO)] its pid, and the end to read from
def fork_child(url, port, process, start_at, deadline)
  Bench.fork_reporting { child_work(url, port, process, start_at, deadline) }
end

# @return [Array<Stats, String>] each child's Stats, or why it has none (hung, crashed, raised)
def collect(children, give_up_at)
  waiters = children.map do |pid, reader|
    Thread.new { [reader.read, Process.wait2(pid).last] }
  end
  children.zip(waiters).each_with_index.map do |((pid, _), waiter), process|
    unless waiter.join([give_up_at - Bench.now, 0].max)
      Process.kill(:KILL, pid)
      waiter.join
      next "process #{process} hung: not finished #{GRACE} s after the end, killed"
    end
    outcome(process, *waiter.value)
  end
end

def outcome(process, data, status)
  report = data.empty? ? nil : Marshal.load(data) # rubocop:disable Security/MarshalLoad -- from our own child
  return "process #{process} raised #{report.class}: #{report.message}" if report.is_a?(Exception)

  report || "process #{process} died without a report (#{status.inspect})"
end

# Connections still on the server once every process has finished, but ours (given time to close).
def server_leftovers(redis)
  me = redis.client(:id)
  give_up_at = Bench.now + 3
  loop do
    others = redis.client(:list).reject { |c| c["id"].to_i == me }
    return others if others.empty? || Bench.now > give_up_at

    sleep 0.05
  end
end

# The lock's keys still there (the fencing counter stays by design), and anything else under PREFIX.
def leftover_keys(redis)
  (LOCK_KEYS.select { |key| redis.exists?(key) } + redis.keys("#{PREFIX}*")).uniq
end

server = RedisServer.new(own_session: true).start
at_exit { server.shutdown }
url = server.url
Bench.header(url)
puts "#{PROCESSES} processes x #{THREADS} threads on one key for #{SECONDS} s: blocking_lock(timeout: #{TIMEOUT}) " \
     "holding 0-#{Bench.ms(MAX_HOLD)}; threads: plain, fair, renew, fair+renew; process 0: every " \
     "#{NONBLOCKING_EVERY}th turn nonblocking_lock"

start_at = Bench.now + 1.0 # time for every process to start
deadline = start_at + SECONDS
children = Array.new(PROCESSES) { |process| fork_child(url, server.port, process, start_at, deadline) }
redis = Redis.new(url: url, timeout: 5) # only now: the children must not inherit its socket
reports = collect(children, deadline + GRACE)
stats, unfinished = reports.partition { |report| report.is_a?(Stats) }
total = stats.reduce(Stats.empty, :merge)

entries, overlaps, out_of_order = MARKS.values_at(2, 3, 4).map { |key| redis.get(key).to_i }
leftovers = server_leftovers(redis)
leaked_keys = leftover_keys(redis)
leaked_connections = total.leaked_connections + leftovers.size
elapsed = [total.finished, deadline].max - start_at
p50, p99 = [0.5, 0.99].map { |fraction| total.waits.empty? ? nil : Bench.percentile(total.waits, fraction) }
failed = [overlaps, out_of_order, leaked_keys.size, leaked_connections, unfinished.size, total.errors].any?(&:positive?)

puts format("soak %<seconds>g s: acquisitions %<entries>d (%<rate>.1f/s; nonblocking_lock ran %<runs>d of " \
            "%<tries>d tries), wait p50 %<p50>s p99 %<p99>s, overlaps %<overlaps>d, out-of-order fencing tokens " \
            "%<ooo>d, leaked locks %<keys>d, leaked connections %<conns>d, unfinished processes %<unfinished>d, " \
            "lost %<lost>d, errors %<errors>d%<first>s: %<verdict>s",
            seconds: SECONDS, entries: entries, rate: entries / elapsed, runs: total.nonblocking_runs,
            tries: total.nonblocking_tries, p50: Bench.ms(p50), p99: Bench.ms(p99), overlaps: overlaps,
            ooo: out_of_order, keys: leaked_keys.size, conns: leaked_connections, unfinished: unfinished.size,
            lost: total.lost, errors: total.errors, first: total.first_error ? " (first: #{total.first_error})" : "",
            verdict: failed ? "FAIL" : "PASS")

details = [redis.get("soak:first_problem"), *unfinished, *total.connection_problems,
           *("leaked keys: #{leaked_keys.join(", ")}" if leaked_keys.any?),
           *leftovers.map { |c| "connection still on the server: #{c.slice("id", "addr", "age", "cmd").inspect}" }]
warn(*details.compact) if details.compact.any?
exit(failed ? 1 : 0)
