# frozen_string_literal: true

# Histories: what clients did with their locks while faults were injected, recorded and checked
# (issue 29). Not a benchmark: it counts what must not happen.
#
#   bundle exec ruby bench/histories.rb --short          (about a minute; exits 1 unless the rows
#                                                          match docs/guarantees.md)
#   bundle exec ruby bench/histories.rb --full [FILE]    (every row longer, 8 processes; the table
#                                                          in markdown, to FILE or stdout)
#   ROWS=sigstop,partition bundle exec ruby bench/histories.rb --short   (only the rows whose name
#                                                          contains one of these)
#
# Each row starts its own redis-server for the locks (a FaultyRedisServer on a free loopback port)
# and forks client processes (4 x 4 threads, --full 8 x 4) that take locks on three hot keys
# through the public API (bench/histories/worker.rb); inside each section they write their fencing
# token to a register on a second redis-server that no fault touches (bench/histories/register.rb).
# Every process records each call on CLOCK_MONOTONIC (one JSON line per call, in a tmp dir); one
# fault per row is injected while the load runs (bench/histories/faults.rb); bench/histories/
# checker.rb reads the histories and counts overlaps, stale writes, token regressions, stuck
# waiters, and the time to recover; the row counts the keys left behind.

require_relative "histories/row"
require_relative "histories/table"
require_relative "histories/register"
require_relative "histories/limits"

module Histories
  # The size; the lock `timeout` (TTL) and blocking calls' `wait`; the load around each fault (from
  # the start to the fault, the longest wait for its moment, after its end) and without one.
  Settings = Struct.new(:processes, :threads, :timeout, :wait, :fault_at, :await, :after, :quiet, keyword_init: true)

  SHORT = Settings.new(processes: 4, threads: 4, timeout: 3, wait: 4, fault_at: 1.0, await: 2.0, after: 2.0,
                       quiet: 3.0)
  FULL = Settings.new(processes: 8, threads: 4, timeout: 3, wait: 4, fault_at: 3.0, await: 6.0, after: 5.0,
                      quiet: 12.0)

  # One row per fault and setting, on one redis-server (the standalone topology). `exclusive`:
  # the guarantees promise no overlap there. The pause below the TTL (2.2 s, above the 2 s a lock
  # handed over lives before its waiter extends it) is the issue's hand-off window: it stays shut
  # only if the waiter extends the lock before its block starts.
  ROWS = [
    Row.new(name: "none", fault: nil, args: [], appendonly: false, exclusive: true),
    Row.new(name: "sigstop fresh holder 2.2 s < TTL", fault: :pause_holder, args: [2.2, :fresh],
            appendonly: false, exclusive: true),
    Row.new(name: "sigstop long holder 4 s > TTL", fault: :pause_holder, args: [4.0, :long_section],
            appendonly: false, exclusive: false),
    Row.new(name: "sigkill redis, no persistence", fault: :kill_restart, args: [0.5], appendonly: false,
            exclusive: false),
    Row.new(name: "sigkill redis, appendonly", fault: :kill_restart, args: [0.5], appendonly: true,
            exclusive: false),
    Row.new(name: "client pause 4 s > TTL", fault: :client_pause, args: [4.0], appendonly: false, exclusive: false),
    Row.new(name: "partition 1.5 s, resume", fault: :partition, args: [1.5, :resume], appendonly: false,
            exclusive: true),
    Row.new(name: "partition 1.5 s, reset", fault: :partition, args: [1.5, :reset], appendonly: false,
            exclusive: true)
  ].freeze

  # In --full only (a topology takes seconds to start, a failover seconds more). Without
  # min_replicas a grant the replica missed is lost with the primary (overlaps) and so may be the
  # last tokens issued (regressions); with min_replicas: 1 an acknowledged grant survives the
  # failover (docs/guarantees.md): no overlap, no regression promised. A slot migrated loses
  # nothing written (its keys, the fencing counter with them, move whole; its locks pause
  # meanwhile: docs/design.md, "Cluster"): no overlap, no regression promised.
  TOPOLOGY_ROWS = [
    Row.new(name: "sentinel failover (sigkill primary)", fault: :failover, args: [20], topology: :sentinel,
            exclusive: false, monotonic: false),
    Row.new(name: "sentinel failover, min_replicas 1", fault: :failover, args: [20], topology: :sentinel,
            locker: { min_replicas: 1 }, exclusive: true),
    Row.new(name: "cluster master sigkill", fault: :kill_master, args: [20], topology: :cluster, exclusive: false,
            monotonic: false),
    Row.new(name: "cluster slot migrated there and back", fault: :migrate_slot, args: [10], topology: :cluster,
            exclusive: true)
  ].freeze

  # The limiter rows (bench/histories/limits.rb): Redis SIGKILLed and down 0.5 s. Only the
  # appendonly one in --short (about 5 s).
  LIMIT_ROWS = [
    LimitRow.new(name: "limiter: none", down: nil, appendonly: false, exact: true),
    LimitRow.new(name: "limiter: sigkill redis, no persistence", down: 0.5, appendonly: false, exact: false),
    LimitRow.new(name: "limiter: sigkill redis, appendonly", down: 0.5, appendonly: true, exact: true)
  ].freeze

  module_function

  def main(argv)
    full = argv.include?("--full")
    abort "usage: #{$PROGRAM_NAME} --short | --full [FILE]" unless full || argv.include?("--short")
    settings = full ? FULL : SHORT
    register = RedisServer.new(own_session: true).start
    outcomes = run(settings, register.url, full)
    limits = run_limits(settings, full)
    output(outcomes, limits, full, (argv - ["--full", "--short"]).first)
    verdict(outcomes, limits)
  ensure
    register&.shutdown
  end

  def run(settings, register_url, full)
    Bench.header(register_url)
    puts "#{settings.processes} processes x #{settings.threads} threads on keys #{KEYS.keys.join(", ")} " \
         "(limit #{KEYS.values.join(", ")}), timeout #{settings.timeout} s, wait #{settings.wait} s"
    rows = full ? ROWS + TOPOLOGY_ROWS : ROWS
    rows = rows.select { |row| ENV["ROWS"].split(",").any? { |part| row.name.include?(part) } } if ENV["ROWS"]
    rows.map do |row|
      RowRun.new(row, settings, register_url).call.tap do |outcome|
        puts format("%<row>s: %<fault>s; %<seconds>.1f s", row: row.name, fault: Table.fault(outcome),
                                                           seconds: outcome.seconds)
      end
    end
  end

  def run_limits(settings, full)
    rows = full ? LIMIT_ROWS : LIMIT_ROWS.select(&:appendonly)
    rows = rows.select { |row| ENV["ROWS"].split(",").any? { |part| row.name.include?(part) } } if ENV["ROWS"]
    rows.map do |row|
      LimitRun.new(row, settings).call.tap do |outcome|
        puts format("%<row>s: %<seconds>.1f s", row: row.name, seconds: outcome.seconds)
      end
    end
  end

  def output(outcomes, limits, full, file)
    format = full ? :markdown : :text
    tables = [[Table, outcomes], [LimitTable, limits]].reject { |_, rows| rows.empty? }
    table = tables.map { |kind, rows| kind.public_send(format, rows) }.join("\n\n")
    file ? File.write(file, "#{table}\n") : puts(table)
  end

  # Exits 1 when a row breaks a documented guarantee, printing why and what the checker saw.
  def verdict(outcomes, limits)
    failures = outcomes.flat_map { |outcome| Table.failures(outcome) } +
               limits.flat_map { |outcome| LimitTable.failures(outcome) }
    outcomes.each do |outcome|
      lines = Table.details(outcome)
      warn("#{outcome.row.name}:", *lines.map { |line| "  #{line}" }) if lines.any?
    end
    return puts("histories: every row matches docs/guarantees.md") if failures.empty?

    puts "histories: FAIL: #{failures.join("; ")}"
    exit 1
  end
end

Histories.main(ARGV) if $PROGRAM_NAME == __FILE__
