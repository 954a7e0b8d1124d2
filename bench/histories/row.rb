# frozen_string_literal: true

require "tmpdir"
require "fileutils"
require_relative "../support"
require_relative "backends"
require_relative "worker"
require_relative "proxy"
require_relative "faults"
require_relative "topology_faults"
require_relative "checker"

module Histories
  # One row of the table: a fault (a method of Faults and its arguments), the lock server's
  # persistence, and whether the documented guarantees promise no overlap under it (`exclusive`)
  # and tokens that never go backwards (`monotonic`, unless false). `topology` (:sentinel,
  # :cluster; standalone when nil) says where the locks live (Backends), `locker` more Locker
  # options (min_replicas).
  Row = Struct.new(:name, :fault, :args, :appendonly, :exclusive, :monotonic, :topology, :locker,
                   keyword_init: true) do
    def partition?
      fault == :partition
    end

    def monotonic?
      monotonic != false
    end
  end

  # What a row's run measured: the Checker's summary, and what only the run can see.
  Outcome = Struct.new(:row, :summary, :leaks, :errors, :unfinished, :faults, :seconds, keyword_init: true)

  # Runs one row: a fresh lock server, `settings.processes` client processes for the load
  # window, the fault in the middle of it, then the leftovers and the histories.
  class RowRun
    def initialize(row, settings, register_url)
      @row = row
      @settings = settings
      @register_url = register_url
      @prefix = "#{row.name.tr(" ", "_")}:"
    end

    # The histories go to a tmp dir, removed afterwards unless KEEP_HISTORIES is set (to look at
    # a row's calls: one JSON line each, p<process>.jsonl, and the gem's log, p<process>.log).
    # @return [Outcome]
    def call
      started = Histories.now
      dir = Dir.mktmpdir("histories")
      @backend = Backends.for(@row).start
      @proxy = Proxy.new(@backend.server.port) if @row.partition?
      measure(dir, started)
    ensure
      @proxy&.close
      @backend&.shutdown
      ENV["KEEP_HISTORIES"] ? warn("#{@row.name}: histories kept in #{dir}") : FileUtils.rm_rf(dir)
    end

    private

    def measure(dir, started)
      plan = plan(dir)
      @stops = []
      children = Array.new(@settings.processes) { |process| spawn_client(plan, process) }
      faults = inject(plan, children.map(&:first))
      end_load(plan)
      unfinished = collect(children, plan)
      leaks = leftovers
      ops = Checker.load(dir)
      Outcome.new(row: @row, summary: Checker.new(ops, faults: faults).summary, leaks: leaks,
                  errors: ops.select { |op| op[:outcome] == "error" }, unfinished: unfinished, faults: faults,
                  seconds: Histories.now - started)
    ensure
      @stops&.each(&:close)
    end

    def plan(dir)
      start_at = Histories.now + 0.5 # time for every process to start
      load = @row.fault ? @settings.fault_at + @settings.await + @row.args.first + @settings.after : @settings.quiet
      fault_at = start_at + @settings.fault_at
      Plan.new(row: @prefix.chomp(":"), register_url: @register_url, threads: @settings.threads,
               timeout: @settings.timeout, wait: @settings.wait, start_at: start_at, stop_at: start_at + load,
               long_window: fault_at..(fault_at + @settings.await), dir: dir)
    end

    # Process 0 goes through the proxy in a partition row; the others always straight to Redis.
    # Each child gets a pipe of its own to hear when the load ends (#end_load).
    def spawn_client(plan, process)
      options = @backend.locker_options(@proxy && process.zero? ? @proxy.url : nil).merge(@row.locker || {})
      stop, @stops[process] = IO.pipe
      child = Bench.fork_reporting do
        @stops.each(&:close)
        Worker.new(plan, process, options).run(stop)
      end
      stop.close
      child
    end

    # The load goes on `after` seconds past the fault's end (the plan's bound, which left room for
    # the longest wait for the fault's moment, is the latest).
    def end_load(plan)
      plan.stop_at = [Histories.now + @settings.after, plan.stop_at].min if @row.fault
      @stops.each { |stop| stop.puts(plan.stop_at) }
    end

    # The backend's admin client is made after the forks: no child shares its socket.
    def inject(plan, pids)
      return [] unless @row.fault

      sleep([plan.start_at + @settings.fault_at - Histories.now, 0].max)
      target = Target.new(backend: @backend, admin: @backend.admin, prefix: @prefix, pids: pids, proxy: @proxy,
                          await: @settings.await)
      Faults.public_send(@row.fault, target, *@row.args)
    end

    # Waits for every client; one still running long after its last call's bound is killed.
    # @return [Array<String>] what went wrong with the clients that did not report
    def collect(children, plan)
      give_up_at = plan.stop_at + plan.wait + 20
      children.each_with_index.filter_map do |(pid, reader), process|
        waiter = Thread.new { [reader.read, Process.wait2(pid).last] }
        unless waiter.join([give_up_at - Histories.now, 0].max)
          Process.kill(:KILL, pid)
          next "process #{process} hung: killed"
        end
        report(process, *waiter.value)
      end
    end

    def report(process, data, status)
      value = data.empty? ? nil : Marshal.load(data) # rubocop:disable Security/MarshalLoad -- our own child
      return "process #{process} raised #{value.class}: #{value.message}" if value.is_a?(Exception)

      value ? nil : "process #{process} died without a report (#{status.inspect})"
    end

    # The lock, queue and waiter keys still there once every client is done. Without a fault,
    # every release reached Redis: anything left is a leak, at once. After one, a lock whose
    # release was lost (a reset, a restart) goes by itself: it gets its TTL and a hand-off's 2 s
    # first. Fencing counters stay by design (bench/soak.rb, spec/support/helpers.rb `held_keys`).
    def leftovers
      deadline = Histories.now + (@row.fault ? @settings.timeout + 2.5 : 0)
      loop do
        keys = @backend.keys.reject { |key| KeySlots.fencing_counter?(key) }
        return keys if keys.empty? || Histories.now >= deadline

        sleep 0.1
      end
    end
  end
end
