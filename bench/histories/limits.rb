# frozen_string_literal: true

require "json"
require "tmpdir"
require "fileutils"
require_relative "../support"
require_relative "backends"
require_relative "limit_checker"

module Histories
  # The limiter mode (issue 29: "admitted counts per interval under the same faults"): client
  # threads call `try_acquire` on one `Limiter.sliding_window(name, LIMIT, per: PER)` on a fresh
  # redis-server, while the row's fault (none, or Redis SIGKILLed and restarted on its port) hits
  # it; every decision is recorded with its call's start and end, and LimitChecker counts the
  # admissions certainly over the limit. `exact`: the docs promise none (docs/limits.md,
  # "Guarantees": a restart without persistence loses counts, appendonly loses nothing).
  LimitRow = Struct.new(:name, :down, :appendonly, :exact, keyword_init: true)

  # What a limit row measured.
  LimitOutcome = Struct.new(:row, :summary, :faults, :seconds, keyword_init: true)

  LIMIT = 20
  PER = 3.0 # longer than Redis is away and the clients take to reach it again (about 1.4 s)
  PACE = 0.01 # a thread's next call comes after rand * PACE

  # Runs one limit row: `settings.processes` processes of `settings.threads` threads for the load
  # (`quiet`, or fault_at + down + after around the fault).
  class LimitRun
    def initialize(row, settings)
      @row = row
      @settings = settings
    end

    # @return [LimitOutcome]
    def call
      started = Histories.now
      dir = Dir.mktmpdir("limits")
      @backend = Backends::Standalone.new(appendonly: @row.appendonly).start
      measure(dir, started)
    ensure
      @backend&.shutdown
      FileUtils.rm_rf(dir)
    end

    private

    # The kill comes half a window after fault_at: the threads took the whole limit at the start
    # and take units again each PER as the first ones leave the window, so a kill on a multiple of
    # PER would fall where the window is about to empty, and hide what a restart forgets.
    def measure(dir, started)
      start_at = Histories.now + 0.5
      fault_at = @settings.fault_at + (PER / 2)
      stop_at = start_at + (@row.down ? fault_at + @row.down + @settings.after : @settings.quiet)
      children = Array.new(@settings.processes) { |process| spawn(dir, process, start_at, stop_at) }
      faults = @row.down ? kill_restart(start_at + fault_at) : []
      children.each { |pid, reader| reader.read.then { Process.wait(pid) } }
      decisions = Dir.glob(File.join(dir, "*.jsonl")).flat_map do |file|
        File.readlines(file).map { |line| JSON.parse(line, symbolize_names: true) }
      end
      LimitOutcome.new(row: @row, summary: LimitChecker.new(decisions, limit: LIMIT, per: PER, faults: faults).summary,
                       faults: faults, seconds: Histories.now - started)
    end

    def spawn(dir, process, start_at, stop_at)
      url = @backend.server.url
      threads = @settings.threads
      Bench.fork_reporting do
        locker = LockManager::Locker.new(redis_url: url, pool_size: threads)
        limiter = LockManager::Limiter.sliding_window("histories", LIMIT, per: PER, locker: locker)
        decisions = Array.new(threads) { Thread.new { decide(limiter, start_at, stop_at) } }.flat_map(&:value)
        File.write(File.join(dir, "p#{process}.jsonl"), decisions.map { |d| "#{JSON.generate(d)}\n" }.join)
      end
    end

    def decide(limiter, start_at, stop_at)
      sleep([start_at - Histories.now, 0].max)
      decisions = []
      while Histories.now < stop_at
        decision = { start: Histories.now }
        begin
          decision[:admitted] = limiter.try_acquire.admitted?
        rescue StandardError => e
          decision[:error] = e.class.name
        end
        decisions << decision.merge(end: Histories.now)
        sleep(rand * PACE)
      end
      decisions
    end

    def kill_restart(at)
      sleep([at - Histories.now, 0].max)
      started = Histories.now
      @backend.server.kill
      sleep(@row.down)
      @backend.server.start
      [{ kind: "sigkill", start: started, end: Histories.now }]
    end
  end
end
