# frozen_string_literal: true

require "io/wait"
require "logger"
require "socket"
require "stringio"

# A private redis-server for fault injection: SIGKILL and restart on the same port, SIGSTOP and
# SIGCONT, and optionally an append-only file fsynced on every write, so that what it held
# before a SIGKILL is still there after the restart.
class FaultyRedisServer < RedisServer
  attr_reader :pid

  # @param appendonly [Boolean] persist every write (--appendonly yes --appendfsync always)
  # @param args [Array<String>] more redis-server options
  def initialize(appendonly: false, args: [])
    super()
    @appendonly = appendonly
    @args = args
  end

  # redis-server runs under a shell that waits for it, not as a child of this process: a child
  # that stops (SIGSTOP) sends its parent a SIGCHLD, which would land in whichever thread of this
  # process is reading from Redis at the time. Stray signals have examples of their own.
  # Returns as soon as it answers, even with an error (LOADING, MASTERDOWN), not once it is ready.
  def start_answering
    start(ready: false)
  end

  def start(ready: true)
    persistence = @appendonly ? %w[--appendonly yes --appendfsync always] : %w[--appendonly no]
    args = [*base_arguments(persistence: persistence), *@args]
    @shell = Process.spawn("sh", "-c", '"${REDIS_SERVER:-redis-server}" "$@" & wait $!', "sh", *args,
                           out: File::NULL, err: File::NULL)
    @paused = false
    ready ? wait_until_ready : wait_until_answering
    @pid = client.then { |c| c.info("server").fetch("process_id").to_i.tap { c.close } }
    self
  end

  # SIGKILL: no shutdown, no save; the port stays free for #start.
  def stop
    return unless @shell

    (@pid ? [@pid] : children_of_shell).each { |pid| Process.kill(:KILL, pid) }
    Process.wait(@shell)
    @pid = @shell = nil
  end

  def kill
    stop
  end

  def running?
    !@shell.nil?
  end

  # SIGSTOP: the process keeps its sockets, the kernel keeps accepting and buffering, nothing answers.
  def pause
    super
    @paused = true
  end

  def resume
    super
    @paused = false
  end

  def shutdown
    resume if @paused && @pid
    super
  end

  private

  # Any reply to a PING is an answer, an error included (LOADING, MASTERDOWN): read off the socket,
  # since client libraries differ in which replies they raise as connection errors (redis-rb 5 does
  # for MASTERDOWN).
  def wait_until_answering
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 10
    until answering?
      raise "redis-server did not start on port #{port}" if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline

      sleep 0.005
    end
  end

  def answering?
    Socket.tcp("127.0.0.1", port, connect_timeout: 0.5) do |socket|
      socket.write("PING\r\n")
      socket.wait_readable(1) && !socket.gets.to_s.empty?
    end
  rescue SystemCallError, IOError
    false
  end

  def children_of_shell
    File.read("/proc/#{@shell}/task/#{@shell}/children").split.map(&:to_i)
  rescue Errno::ENOENT
    []
  end
end

# Helpers of the fault suite (spec/faults): private servers, their clients, and what the gem
# left on them.
module FaultHelpers
  # Started now, shut down after the example (resumed first if it is paused).
  def start_server(**options)
    own_server(FaultyRedisServer, **options)
  end

  def close_fault_clients
    (@fault_clients || []).each(&:close)
  end

  # A redis-rb client of the server, closed after the example.
  def client_of(server, timeout: 5)
    client = Redis.new(url: server.url, timeout: timeout)
    (@fault_clients ||= []) << client
    client
  end

  def locker_on(server, **options)
    LockManager::Locker.new(redis_url: server.url, key_prefix: prefix, **options)
  end

  # The gem's pooled connections as Redis sees them: every normal client but `admin` itself
  # and subscribers (the subscriber connection lives outside the pool).
  def pool_client_ids(admin)
    me = admin.call("CLIENT", "ID")
    admin.client(:list).reject { |c| c["id"].to_i == me || c["flags"].include?("P") }.map { |c| c["id"].to_i }
  end

  # Makes `locker`'s pool hold `size` connections: `size` calls at once while Redis is paused. On a
  # loaded machine a thread may start after the pause ended and reuse a connection: so again until
  # the pool holds them.
  def fill_pool(locker, size)
    eventually(timeout: 10) do
      admin.call("CLIENT", "PAUSE", 300, "ALL")
      Array.new(size) { |i| Thread.new { locker.locked?("fill#{i}") } }.each(&:join)
      locker.pool_state.first == size
    end
  end

  def command_calls(admin, name)
    admin.info("commandstats").dig(name, "calls").to_i
  end

  # The gem's warnings (failed releases, lost locks) in a string.
  def capture_log
    log = StringIO.new
    LockManager.configure { |c| c.logger = Logger.new(log) }
    log
  end

  # Another process's lock, as far as Redis can tell: its own Locker and pool, a long TTL.
  def foreign_lock(server, key, timeout: 60)
    locker_on(server, pool_size: 1).try_lock(key, timeout: timeout) || raise("#{key} is already held")
  end

  # Runs the block until it stops raising ConnectionError, for `within` seconds at most. Once
  # Redis is back, reconnects that failed while it was away are retried within 0.5 s
  # (docs/design.md), and calls meanwhile may still fail, with ConnectionError only.
  def once_back(within:)
    deadline = monotonic + within
    begin
      yield
    rescue LockManager::ConnectionError
      raise if monotonic > deadline

      sleep 0.05
      retry
    end
  end

  # With FAULTS_VERBOSE=1, prints what an example measured (durations against their bounds).
  def report(**values)
    return unless ENV["FAULTS_VERBOSE"]

    shown = values.map { |name, value| "#{name}=#{value.is_a?(Float) ? format("%.3f", value) : value.inspect}" }
    warn "#{RSpec.current_example.full_description}\n    #{shown.join(" ")}"
  end

  # Runs the block and returns [its value or the error it raised, seconds it took].
  def outcome_and_time
    started = monotonic
    value = begin
      yield
    rescue StandardError => e
      e
    end
    [value, monotonic - started]
  end
end

# What the Thread#raise chaos did to each lock cycle, counted under a mutex.
class ChaosTally
  attr_reader :cycles, :interrupted, :ran, :overlaps, :ran_on_held, :unexpected, :longest

  def initialize
    @mutex = Mutex.new
    @holders = Hash.new(0)
    @cycles = @interrupted = @ran = @overlaps = @ran_on_held = 0
    @longest = 0.0
    @unexpected = []
  end

  # One lock cycle, run with `error_class` deferred (the cycle itself lets it in): an
  # interrupt ends the cycle early; anything else raised is unexpected.
  def cycle(error_class)
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    outcome = begin
      yield
      :done
    rescue error_class
      :interrupted
    rescue StandardError => e
      e
    end
    record(outcome, Process.clock_gettime(Process::CLOCK_MONOTONIC) - started)
  end

  # The body of a locked block: counts who holds `key` meanwhile. The chaos may end it
  # early, but not between the counting in and out.
  def hold(key, error_class)
    Thread.handle_interrupt(error_class => :never) do
      enter(key)
      Thread.handle_interrupt(error_class => :immediate) { Thread.pass }
    ensure
      @mutex.synchronize { @holders[key] -= 1 }
    end
  end

  private

  def enter(key)
    @mutex.synchronize do
      @holders[key] += 1
      @ran += 1
      @overlaps += 1 if @holders[key] > 1
      @ran_on_held += 1 if key == "held"
    end
  end

  def record(outcome, took)
    @mutex.synchronize do
      @cycles += 1
      @interrupted += 1 if outcome == :interrupted
      @unexpected << outcome if outcome.is_a?(Exception)
      @longest = took if took > @longest
    end
  end
end
