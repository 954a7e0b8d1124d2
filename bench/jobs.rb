# frozen_string_literal: true

# Job uniqueness at push, on Sidekiq's in-process client (no sidekiq server: the jobs are only
# enqueued): a class with `lock_with :until_executed, unique_for: 3600` against a plain Sidekiq
# class (the gem's middleware installed for both, as in an app), on one redis-server, in one run.
#
#   bundle exec ruby bench/jobs.rb
#   SIDEKIQ=7.3.9 bundle exec ruby bench/jobs.rb   # a vendored Sidekiq (../shared/vendor; 8.1.7 on Ruby 3.3)
#
#   perform_async  PUSHES (default 10000) pushes of each kind in ROUNDS (default 5) alternating
#                  rounds, distinct arguments: plain; plain after one redis-rb GET (what one more
#                  round trip per push costs here, with no lock); unique, accepted (each claims
#                  its lock); unique, refused (the same arguments pushed again while their locks
#                  are held). Pushes/s, and per push Redis's commands (INFO commandstats, those a
#                  script runs included) and Redis's CPU.
#   push_bulk      BATCHES (default 10) Sidekiq::Client.push_bulk of 1,000 jobs of each kind
#                  (plain, accepted, refused), alternating: time per batch, the same per job.
#   round trips    COUNTED (default 200) pushes, then one batch of 1,000, of each kind, through two
#                  TCP proxies (one for Sidekiq's connections, one for lock_manager's) that hold each
#                  reply until the client has sent nothing for 10 ms: a pipeline counts once, a
#                  client that waits for a reply before sending more counts once per wait. Beside
#                  them, the calls of LockManager::Locker#claim (one round trip each on one Redis:
#                  ext/lock_manager/src/claims.rs). Target: at most 2 round trips of lock_manager's
#                  per batch of 1,000.
#
# Before timing, one key is claimed in each of the 16,384 hash slots, so that every slot's fencing
# counter exists, as on a Redis that has served locks a while: on a fresh Redis the first claim in
# a slot also runs TIME and a second SET, once per slot (ext/lock_manager/src/lua/shared/fencing.lua).
# Always a throwaway redis-server of its own (not REDIS_URL: the command counts need a server that
# nothing else talks to). sidekiq-unique-jobs is not measured: it cannot be installed on this
# machine (bench/README.md).

require_relative "../spec/support/stack"
Stack.select! # first: SIDEKIQ puts the vendored libraries ahead of the stack's gems
Stack.check!
require "sidekiq"
require_relative "../spec/support/sidekiq_process"

require "etc"
require "logger"
require "securerandom"
require "socket"
require_relative "support"
require_relative "../lib/lock_manager/worker"
require_relative "job_classes"

PUSHES = Integer(ENV.fetch("PUSHES", "10000"))
ROUNDS = Integer(ENV.fetch("ROUNDS", "5"))
BATCHES = Integer(ENV.fetch("BATCHES", "10"))
COUNTED = Integer(ENV.fetch("COUNTED", "200"))
BATCH = 1_000
WARMUP = 500
BULK_TARGET = 2 # lock_manager's round trips per batch of 1,000, at most
COMMANDS = %w[evalsha eval get set incr sadd lpush].freeze
RUN = SecureRandom.hex(4) # in every job's arguments

class BenchBug < StandardError; end

# Counts LockManager::Locker#claim calls and their keys: one round trip per call on one Redis
# (ext/lock_manager/src/claims.rs). Prepended for the counted pass only.
module ClaimCounter
  @calls = []

  class << self
    attr_reader :calls
  end

  def claim(keys, tokens, seconds, **pushes)
    ClaimCounter.calls << keys.size
    super
  end
end

# A TCP proxy to the redis-server, in a process of its own, that counts round trips: it passes the
# client's bytes on at once and holds each reply until the client has sent nothing for QUIET
# seconds. A client that pipelines sends everything before it waits: its pipeline counts once. A
# client that waits for a reply before it sends more counts once per wait. (A client pausing
# mid-pipeline would count more, never fewer.)
class RoundTripProxy
  QUIET = 0.01 # well above a pause between two commands of one pipeline (redis-rb writes them one by one)

  attr_reader :url

  def initialize(port)
    listener = TCPServer.new("127.0.0.1", 0)
    @url = "redis://127.0.0.1:#{listener.addr[1]}/0"
    @control, theirs = UNIXSocket.pair
    @pid = fork do
      @control.close
      serve(listener, port, theirs)
    ensure
      exit!(0) # not exit: the at_exit handlers (stopping the redis-server) are the parent's
    end
    [listener, theirs].each(&:close)
  end

  # @return [Integer] round trips so far, over every connection
  def round_trips
    @control.puts("?")
    Integer(@control.gets)
  end

  # Ends its process (which may not see its control socket closed: a proxy forked later holds it).
  def stop
    @control.close
    Process.kill(:TERM, @pid)
    Process.wait(@pid)
  rescue Errno::ESRCH, Errno::ECHILD
    nil
  end

  private

  def serve(listener, port, control)
    count = 0
    lock = Mutex.new
    Thread.new do
      loop do
        client = listener.accept
        server = TCPSocket.new("127.0.0.1", port)
        [client, server].each { |socket| socket.setsockopt(Socket::IPPROTO_TCP, Socket::TCP_NODELAY, 1) }
        Thread.new { Relay.new(client, server).run { lock.synchronize { count += 1 } } }
      end
    end
    control.puts(lock.synchronize { count }) while control.gets
  end

  # One client's connection and the server's.
  class Relay
    def initialize(client, server)
      @client = client
      @server = server
      @held = +""
      @asked_at = nil # when the client last sent bytes that no reply answered yet
    end

    # Yields once per reply that answers bytes the client sent since the last reply.
    def run
      loop do
        ready, = IO.select([@client, @server], nil, nil, quiet_in)
        return unless ready.nil? || ready.all? { |io| read(io) }
        next unless answer?

        yield if @asked_at
        @client.write(@held)
        @held.clear
        @asked_at = nil
      end
    ensure
      [@client, @server].each(&:close)
    end

    private

    # Seconds until the client has been quiet long enough for a reply held; nil: no timeout.
    def quiet_in
      (@asked_at + QUIET - Bench.now).clamp(0, nil) if @asked_at && !@held.empty?
    end

    def answer?
      !@held.empty? && !(@asked_at && Bench.now - @asked_at < QUIET)
    end

    # @return [Boolean] false once `io` is closed
    def read(io)
      data = io.read_nonblock(65_536, exception: false)
      return !data.nil? unless data.is_a?(String)

      if io == @client
        @server.write(data)
        @asked_at = Bench.now
      else
        @held << data
      end
      true
    end
  end
end

@next_number = 0

# `count` job numbers never pushed before in this run.
def fresh(count)
  first = @next_number
  @next_number += count
  (first...@next_number).to_a
end

# @param before [Proc, nil] called with each number before its push (the reference's round trip)
# @return [Array(Integer, Integer, Float)] pushes, how many Sidekiq accepted, seconds
def push_each(klass, numbers, before: nil)
  started = Bench.now
  accepted = numbers.count do |number|
    before&.call(number)
    klass.perform_async(number, RUN)
  end
  [numbers.size, accepted, Bench.now - started]
end

# One Sidekiq::Client.push_bulk of these numbers' jobs.
# @return [Array(Integer, Integer, Float)] as #push_each
def push_bulk(klass, numbers)
  started = Bench.now
  jids = Sidekiq::Client.push_bulk("class" => klass, "args" => numbers.map { |number| [number, RUN] })
  [numbers.size, jids.compact.size, Bench.now - started]
end

# Calls per command since the server started, from INFO commandstats (INFO itself left out), and
# the server's CPU seconds.
def server_counters
  calls = ADMIN.info("commandstats").transform_values { |stats| Integer(stats["calls"]) }.except("info")
  [calls, Bench.redis_cpu(ADMIN)]
end

# Runs one measured step (its block returns #push_each's numbers) and adds it to `totals[name]`.
def measure(totals, name)
  GC.start # each step pays for its own garbage only
  calls_before, cpu_before = server_counters
  pushes, accepted, seconds = yield
  calls, cpu = server_counters
  wanted = name.include?("refused") ? 0 : pushes
  raise BenchBug, "#{name}: #{accepted} of #{pushes} pushes accepted, wanted #{wanted}" unless accepted == wanted

  total = totals[name]
  calls.each { |command, count| total[:commands][command] += count - calls_before.fetch(command, 0) }
  total[:redis_cpu] += cpu - cpu_before
  total[:pushes] += pushes
  total[:seconds] << seconds
end

def new_totals
  Hash.new { |hash, name| hash[name] = { pushes: 0, seconds: [], commands: Hash.new(0), redis_cpu: 0.0 } }
end

# The kinds in turn, their order rotated every other round; the refused pushes always come after
# the accepted ones whose arguments they push again.
# @param steps [Hash{String => Proc}] plain first, refused last
def alternate(totals, round, steps)
  (round.even? ? steps : steps.to_a.rotate).each { |name, step| measure(totals, name, &step) }
end

# Claims one key in each of Redis's 16,384 hash slots (for 1 s): every slot's fencing counter
# exists after it (see the head of this file).
# @return [Array(Integer, Float)] how many counters this seeded, seconds
def seed_fencing_counters
  started = Bench.now
  before = server_counters.first.fetch("time", 0)
  tags = Array.new(KeySlots::SLOTS) { |slot| KeySlots.tag(slot) }
  tags.each_slice(BATCH) do |slice|
    LockManager.locker.claim(slice.map { |tag| "bench-seed:{#{tag}}" }, slice.map { "seed" }, slice.map { 1 })
  end
  [server_counters.first.fetch("time", 0) - before, Bench.now - started]
end

def perform_async_rounds
  totals = new_totals
  warm = fresh(WARMUP)
  push_each(PlainJob, fresh(WARMUP), before: ->(number) { ADMIN.get("bench:reference:#{number}") })
  2.times { push_each(UniqueJob, warm) } # accepted, then refused
  ROUNDS.times do |round|
    plain, reference, unique = Array.new(3) { fresh(PUSHES / ROUNDS) }
    alternate(totals, round,
              "plain" => -> { push_each(PlainJob, plain) },
              "plain + 1 GET (redis-rb)" => lambda {
                push_each(PlainJob, reference, before: ->(number) { ADMIN.get("bench:reference:#{number}") })
              },
              "until_executed, accepted" => -> { push_each(UniqueJob, unique) },
              "until_executed, refused" => -> { push_each(UniqueJob, unique) })
  end
  totals
end

def push_bulk_rounds
  totals = new_totals
  BATCHES.times do |round|
    plain, unique = Array.new(2) { fresh(BATCH) }
    alternate(totals, round,
              "plain" => -> { push_bulk(PlainJob, plain) },
              "until_executed, accepted" => -> { push_bulk(UniqueJob, unique) },
              "until_executed, refused" => -> { push_bulk(UniqueJob, unique) })
  end
  totals
end

def rate(total)
  total[:pushes] / total[:seconds].sum
end

# Per push (per job of a bulk): each COMMANDS column, then every command, then Redis's CPU in µs.
def per_push(total)
  calls = [*COMMANDS.map { |command| total[:commands][command] }, total[:commands].values.sum]
  [*calls.map { |count| format("%6.2f", count.to_f / total[:pushes]) },
   format("%6.1f", total[:redis_cpu] / total[:pushes] * 1e6)].join(" ")
end

def per_push_header(what)
  "#{what}: #{[*COMMANDS, "all"].map { |command| format("%6s", command) }.join(" ")}  redis CPU µs"
end

def report_perform_async(totals)
  plain = rate(totals["plain"])
  puts "perform_async: #{PUSHES} pushes of each kind in #{ROUNDS} alternating rounds, after #{WARMUP} of warm-up"
  puts format("  %<kind>-26s %<rate>9s %<ratio>9s %<extra>12s   %<per>s",
              kind: "kind", rate: "pushes/s", ratio: "vs plain", extra: "µs more/push",
              per: per_push_header("commands per push"))
  totals.each do |kind, total|
    puts format("  %<kind>-26s %<rate>9.0f %<ratio>8.2fx %<extra>12.1f   %<pad>19s%<per>s",
                kind: kind, rate: rate(total), ratio: rate(total) / plain, pad: "", per: per_push(total),
                extra: ((1 / rate(total)) - (1 / plain)) * 1e6)
  end
end

def report_push_bulk(totals)
  plain = Bench.percentile(totals["plain"][:seconds], 0.5)
  puts "push_bulk: #{BATCHES} batches of #{BATCH} jobs of each kind, alternating (time per batch: the median)"
  puts format("  %<kind>-26s %<batch>9s %<ratio>9s %<rate>12s   %<per>s",
              kind: "kind", batch: "per batch", ratio: "vs plain", rate: "jobs/s",
              per: per_push_header("commands per job"))
  totals.each do |kind, total|
    median = Bench.percentile(total[:seconds], 0.5)
    puts format("  %<kind>-26s %<batch>9s %<ratio>8.2fx %<rate>12.0f   %<pad>18s%<per>s",
                kind: kind, batch: Bench.ms(median), ratio: median / plain, rate: rate(total), pad: "",
                per: per_push(total))
  end
end

# Every accepted push is in the queue, and no refused one.
def check_queue(timed)
  accepted = timed.sum { |totals| totals.sum { |kind, total| kind.include?("refused") ? 0 : total[:pushes] } }
  queued = ADMIN.llen("queue:#{JOB_QUEUE}") - (2 * WARMUP)
  raise BenchBug, "#{queued} jobs queued by the measured steps, #{accepted} accepted" unless queued == accepted

  puts "#{queued} jobs queued by the measured steps: every accepted push, no refused one"
end

# Round trips of Sidekiq's connections and of lock_manager's while the block runs, and the
# Locker#claim calls it made (their sizes).
def counted(proxies)
  before = proxies.map(&:round_trips)
  calls = ClaimCounter.calls.size
  yield
  [*proxies.map(&:round_trips).zip(before).map { |after, start| after - start }, ClaimCounter.calls[calls..]]
end

# The proxy's own check: two GETs one after the other count 2, two pipelined 1.
def check_proxy(proxy)
  redis = Redis.new(url: proxy.url)
  redis.ping # connected: not counted
  one_by_one = -> { 2.times { redis.get("bench:proxy") } }
  pipelined = -> { redis.pipelined { |pipeline| 2.times { pipeline.get("bench:proxy") } } }
  counts = [one_by_one, pipelined].map { |step| counted([proxy], &step).first }
  raise BenchBug, "the proxy counted #{counts} round trips, wanted [2, 1]" unless counts == [2, 1]

  puts "proxy check: 2 GETs one after the other counted #{counts.first} round trips, pipelined #{counts.last}"
ensure
  redis&.close
end

# The same kinds again, COUNTED pushes then a batch each, Sidekiq and lock_manager each through
# its proxy. Leaves LockManager configured on the lock_manager proxy.
def round_trip_counts(proxies)
  LockManager.configure { |config| config.redis_url = proxies.last.url }
  LockManager::Locker.prepend(ClaimCounter)
  Sidekiq::Client.via(Sidekiq::RedisConnection.create(url: proxies.first.url, size: 1)) do
    warm = fresh(10) # the connections opened: not counted
    push_each(PlainJob, fresh(10))
    2.times { push_each(UniqueJob, warm) }
    unique = fresh(COUNTED)
    batch = fresh(BATCH)
    { "perform_async plain" => -> { push_each(PlainJob, fresh(COUNTED)) },
      "perform_async accepted" => -> { push_each(UniqueJob, unique) },
      "perform_async refused" => -> { push_each(UniqueJob, unique) },
      "push_bulk plain" => -> { push_bulk(PlainJob, fresh(BATCH)) },
      "push_bulk accepted" => -> { push_bulk(UniqueJob, batch) },
      "push_bulk refused" => -> { push_bulk(UniqueJob, batch) } }.transform_values { |step| counted(proxies, &step) }
  end
end

def report_round_trips(counts)
  puts "round trips, through counting proxies (#{COUNTED} pushes, then 1 batch of #{BATCH}, of each kind; each " \
       "reply held until the client is quiet #{(RoundTripProxy::QUIET * 1000).round} ms):"
  puts format("  %<kind>-24s %<sidekiq>16s %<locks>16s   %<claims>s",
              kind: "kind", sidekiq: "Sidekiq's", locks: "lock_manager's", claims: "Locker#claim calls (calls x keys)")
  counts.each do |kind, (sidekiq, locks, claims)|
    per, unit = kind.start_with?("push_bulk") ? [1, "batch"] : [COUNTED, "push"]
    puts format("  %<kind>-24s %<sidekiq>10.2f/%<unit>-5s %<locks>10.2f/%<unit>-5s   %<calls>.2f/%<unit>s%<keys>s",
                kind: kind, sidekiq: sidekiq.to_f / per, locks: locks.to_f / per, unit: unit,
                calls: claims.size.to_f / per, keys: claims.tally.map { |keys, n| " (#{n} x #{keys})" }.join)
  end
end

def bulk_verdict(counts)
  worst = counts.select { |kind, _| kind.start_with?("push_bulk") }.values.map { |_, locks, _| locks }.max
  "lock_manager's round trips per push_bulk of #{BATCH}: at most #{worst} (target <= #{BULK_TARGET}): " \
    "#{Bench.verdict(worst, BULK_TARGET)}"
end

def sidekiq_line
  path = $LOADED_FEATURES.find { |feature| feature.end_with?("/sidekiq.rb") }
  "sidekiq:      #{Sidekiq::VERSION} (#{Stack.sidekiq ? "vendored" : "Bundler's"}: #{path}), " \
    "in-process client, no sidekiq server"
end

def unique_jobs_line
  why = if Gem::Specification.find_all_by_name("sidekiq-unique-jobs").empty?
          "it cannot be installed here: no rubygems.org, and Debian has no package"
        else
          "installed, but this script does not run it"
        end
  "sidekiq-unique-jobs: not measured (#{why})"
end

Redis.silence_deprecations = true if Redis.respond_to?(:silence_deprecations=) # Sidekiq 6.4's calls
Sidekiq.logger.level = Logger::WARN # refused pushes are logged at info
server = RedisServer.new(own_session: true).start
proxies = [RoundTripProxy.new(server.port), RoundTripProxy.new(server.port)] # forked before any connection
at_exit do
  server.shutdown
  proxies.each(&:stop)
end
ADMIN = Redis.new(url: server.url) # INFO, and the reference's GET
LockManager.configure { |config| config.redis_url = server.url }
Sidekiq.configure_client { |config| config.redis = { url: server.url, size: 1 } }

puts "ruby:         #{RUBY_DESCRIPTION}"
puts "redis-server: #{ADMIN.info("server")["redis_version"]} (throwaway#{", REDIS_URL not used" if ENV["REDIS_URL"]})"
puts sidekiq_line
puts "date:         #{Time.now.strftime("%F %T %z")}, #{Etc.nprocessors} cores"
seeded, seconds = seed_fencing_counters
puts "fencing counters: #{seeded} of #{KeySlots::SLOTS} hash slots' seeded before timing (#{Bench.ms(seconds)})", ""
begin
  timed = [perform_async_rounds, push_bulk_rounds]
  report_perform_async(timed.first)
  puts
  report_push_bulk(timed.last)
  check_queue(timed)
  puts
  check_proxy(proxies.last)
  counts = round_trip_counts(proxies)
  report_round_trips(counts)
  puts "", bulk_verdict(counts), unique_jobs_line
rescue BenchBug => e
  abort "BUG: #{e.message}"
end
