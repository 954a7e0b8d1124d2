# frozen_string_literal: true

module Histories
  # The table of a run (plain text or markdown), and the rows' verdicts against the documented
  # guarantees (docs/guarantees.md, "Measured under faults").
  module Table
    HEADERS = ["row", "operations", "acquisitions", "overlaps", "told lost", "stale writes accepted",
               "stale writes rejected", "token regressions", "stuck waiters", "leaks", "recovery", "errors"].freeze

    module_function

    def cells(outcome)
      s = outcome.summary
      [outcome.row.name, s.operations, s.acquisitions, s.overlaps, s.lost, s.stale_accepted, s.stale_rejected,
       s.regressions, s.stuck, outcome.leaks.size, recovery(outcome), outcome.errors.size].map(&:to_s)
    end

    def recovery(outcome)
      return "n/a" if outcome.faults.empty?

      seconds = outcome.summary.recovery
      seconds ? format("%.0f ms", seconds * 1000) : "none"
    end

    def markdown(outcomes)
      markdown_of(HEADERS, outcomes.map { |outcome| cells(outcome) })
    end

    def text(outcomes)
      text_of(HEADERS, outcomes.map { |outcome| cells(outcome) })
    end

    def markdown_of(headers, rows)
      [headers, headers.map { "---" }, *rows].map { |cells| "| #{cells.join(" | ")} |" }.join("\n")
    end

    def text_of(headers, rows)
      rows = [headers, *rows]
      widths = rows.transpose.map { |column| column.map(&:size).max }
      rows.map { |cells| cells.zip(widths).map { |cell, width| cell.ljust(width) }.join("  ").rstrip }.join("\n")
    end

    # What the row breaks of the guarantees: none of these under any fault (stale writes accepted,
    # stuck waiters, leaks, clients that never finished), no overlap where the row is `exclusive`
    # (no fault, a partition shorter than the TTL, a pause shorter than it, a failover with
    # min_replicas), no token regression where it is `monotonic` (all but a failover without
    # min_replicas: docs/guarantees.md, "As safe as one Redis"), and no error without a fault.
    # @return [Array<String>] empty when the row matches them
    def failures(outcome)
      s = outcome.summary
      counts = { "stale writes accepted" => s.stale_accepted, "stuck waiters" => s.stuck, "leaks" => outcome.leaks.size,
                 "unfinished clients" => outcome.unfinished.size }
      counts["overlaps"] = s.overlaps if outcome.row.exclusive
      counts["token regressions"] = s.regressions if outcome.row.monotonic?
      counts["errors"] = outcome.errors.size unless outcome.row.fault
      counts.select { |_, count| count.positive? }.map { |what, count| "#{outcome.row.name}: #{count} #{what}" }
    end

    # What the row's fault did, as injected: "sigstop of pid 123 for 2.20 s".
    def fault(outcome)
      return "no fault" unless outcome.row.fault
      return "#{outcome.row.fault}: no target found, nothing injected" if outcome.faults.empty?

      outcome.faults.map do |fault|
        of = fault[:pid] ? " of pid #{fault[:pid]}" : ""
        during = fault[:during] ? " during #{fault[:during]}" : ""
        format("%<kind>s%<of>s for %<seconds>.2f s%<during>s", kind: fault[:kind], of: of, during: during,
                                                               seconds: fault[:end] - fault[:start])
      end.join(", ")
    end

    # Lines saying what went wrong in a row, for stderr.
    def details(outcome)
      [*outcome.summary.problems, *outcome.unfinished, *outcome.leaks.first(5).map { |key| "leaked key #{key}" },
       *outcome.errors.first(3).map { |op| "error: #{op[:api]} on #{op[:key]}: #{op[:error]}" }]
    end
  end

  # The limiter rows' table and verdicts (bench/histories/limits.rb).
  module LimitTable
    HEADERS = ["limiter row", "decisions", "admitted", "admitted over the limit", "most admitted within per",
               "recovery", "errors"].freeze

    module_function

    def cells(outcome)
      s = outcome.summary
      busiest = "#{s.busiest} (limit #{LIMIT} per #{PER.to_i} s)"
      [outcome.row.name, s.decisions, s.admitted, s.over, busiest, recovery(outcome), s.errors].map(&:to_s)
    end

    def recovery(outcome)
      return "n/a" if outcome.faults.empty?

      outcome.summary.recovery ? format("%.0f ms", outcome.summary.recovery * 1000) : "none"
    end

    def markdown(outcomes)
      Table.markdown_of(HEADERS, outcomes.map { |outcome| cells(outcome) })
    end

    def text(outcomes)
      Table.text_of(HEADERS, outcomes.map { |outcome| cells(outcome) })
    end

    # Over the limit where the row is `exact`; an error without a fault.
    def failures(outcome)
      s = outcome.summary
      counts = {}
      counts["admitted over the limit"] = s.over if outcome.row.exact
      counts["errors"] = s.errors unless outcome.row.down
      counts.select { |_, count| count.positive? }.map { |what, count| "#{outcome.row.name}: #{count} #{what}" }
    end
  end
end
