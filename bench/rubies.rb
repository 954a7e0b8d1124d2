# frozen_string_literal: true

# The uncontended lock cycle on both stacks' Rubies (Debian 12's 3.1, Debian 13's 3.3 through
# bin/stack), against one redis-server, in one run: alternating rounds of the same workload in a
# process of each Ruby, each loading the extension built for it. Then the control: PING round trips
# over Ruby's own TCPSocket in the same threads, which shows what a Ruby's thread scheduler costs any
# I/O (bench/README.md, "Ruby 3.3 at 8 threads"). Prints ops/s, client CPU and context switches per
# operation for each, and 3.3/3.1.
#
#   bundle exec ruby bench/rubies.rb          # on the host; the other Ruby runs in its bin/stack root
#
# BENCH_SECONDS (default 3) is the measured time per Ruby and thread count, in ROUNDS (default 6)
# rounds. `bin/stack modern bin/setup` must have compiled the 3.3 extension first.
# Run by hand, not by `rake bench`: it needs root for the other stack.

require_relative "support"

DURATION = Float(ENV.fetch("BENCH_SECONDS", "3"))
ROUNDS = Integer(ENV.fetch("ROUNDS", "6"))
ROOT = File.expand_path("..", __dir__)
WORKER = File.join(__dir__, "cycles.rb")
HERE = (File.read("/etc/os-release")[/^VERSION_CODENAME=(\w+)/, 1] rescue nil) # rubocop:disable Style/RescueModifier
OTHER = HERE == "trixie" ? "debian12" : "debian13"

# One round in a Ruby: `threads` threads running `workload` for `seconds`.
# @return [Array(String, Integer, Float, Float, Integer)] the Ruby's version, operations, wall and CPU
#   seconds, context switches
def round(command, url, workload, threads, seconds)
  arguments = [WORKER, url, threads.to_s, seconds.to_s, workload]
  output = IO.popen([*command, *arguments], chdir: ROOT, err: %i[child out], &:read)
  line = output.lines.grep(/\Acycles /).last or abort "the worker failed:\n#{output}"
  version, operations, wall, cpu, switches = line.split.drop(1)
  [version, Integer(operations), Float(wall), Float(cpu), Integer(switches)]
end

url = Bench.redis_url
rubies = { "here" => [RbConfig.ruby], OTHER => [File.join(ROOT, "bin/stack"), OTHER, "bundle", "exec", "ruby"] }
Bench.header(url)
puts "#{DURATION} s per Ruby and thread count, in #{ROUNDS} alternating rounds (the other Ruby: bin/stack #{OTHER})"
LINE = "%<workload>-9s %<threads>-8s %<ruby>-8s %<rate>10s %<cpu>12s %<switches>16s"
puts "", format(LINE, workload: "workload", threads: "threads", ruby: "ruby", rate: "ops/s", cpu: "CPU/op (µs)",
                      switches: "switches/op")
%w[lock ping].product([1, 8]).each do |workload, threads|
  totals = Hash.new { |hash, key| hash[key] = [nil, 0, 0.0, 0.0, 0] }
  rubies.each_value { |command| round(command, url, workload, threads, 0.3) } # warm-up: loaded, Redis warm
  ROUNDS.times do |i|
    (i.even? ? rubies : rubies.reverse_each).each do |name, command|
      version, *figures = round(command, url, workload, threads, DURATION / ROUNDS)
      totals[name] = [version, *totals[name].drop(1).zip(figures).map(&:sum)]
    end
  end
  figures = totals.transform_values do |version, done, wall, cpu, switches|
    [version, done / wall, cpu / done * 1e6, switches.fdiv(done)]
  end
  row = lambda do |ruby, rate, cpu, switches|
    format(LINE, workload: workload, threads: threads, ruby: ruby, rate: rate, cpu: cpu, switches: switches)
  end
  figures.each_value do |version, rate, cpu, switches|
    puts row.call(version, rate.round, format("%.1f", cpu), format("%.2f", switches))
  end
  old, new = figures.values.sort_by(&:first)
  puts row.call("#{new[0]}/#{old[0]}", *(1..3).map { |i| format("%.2fx", new[i] / old[i]) })
end
