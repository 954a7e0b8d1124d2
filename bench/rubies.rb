# frozen_string_literal: true

# The uncontended lock cycle on both stacks' Rubies (Debian 12's 3.1, Debian 13's 3.3 through
# bin/stack), against one redis-server, in one run: alternating rounds of the same workload in a
# process of each Ruby, each loading the extension built for it. Prints ops/s and client CPU per
# cycle for each, and 3.3/3.1.
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

# One round in a Ruby: `threads` threads cycling for `seconds`.
# @return [Array(String, Integer, Float, Float)] the Ruby's version, cycles, wall and CPU seconds
def round(command, url, threads, seconds)
  output = IO.popen([*command, WORKER, url, threads.to_s, seconds.to_s], chdir: ROOT, err: %i[child out], &:read)
  line = output.lines.grep(/\Acycles /).last or abort "the worker failed:\n#{output}"
  version, cycles, wall, cpu = line.split.drop(1)
  [version, Integer(cycles), Float(wall), Float(cpu)]
end

url = Bench.redis_url
rubies = { "here" => [RbConfig.ruby], OTHER => [File.join(ROOT, "bin/stack"), OTHER, "bundle", "exec", "ruby"] }
Bench.header(url)
puts "#{DURATION} s per Ruby and thread count, in #{ROUNDS} alternating rounds (the other Ruby: bin/stack #{OTHER})"
LINE = "%<threads>-10s %<ruby>-8s %<rate>12s %<cpu>16s"
puts "", format(LINE, threads: "threads", ruby: "ruby", rate: "ops/s", cpu: "CPU/cycle (µs)")
[1, 8].each do |threads|
  totals = Hash.new { |hash, key| hash[key] = [nil, 0, 0.0, 0.0] }
  rubies.each_value { |command| round(command, url, threads, 0.3) } # warm-up: the extension loaded, Redis warm
  ROUNDS.times do |i|
    (i.even? ? rubies : rubies.reverse_each).each do |name, command|
      version, cycles, wall, cpu = round(command, url, threads, DURATION / ROUNDS)
      totals[name] = [version, totals[name][1] + cycles, totals[name][2] + wall, totals[name][3] + cpu]
    end
  end
  figures = totals.transform_values { |version, cycles, wall, cpu| [version, cycles / wall, cpu / cycles * 1e6] }
  figures.each_value do |version, rate, cpu|
    puts format(LINE, threads: threads, ruby: version, rate: rate.round, cpu: format("%.1f", cpu))
  end
  old, new = figures.values.sort_by(&:first)
  puts format(LINE, threads: threads, ruby: "#{new[0]}/#{old[0]}", rate: format("%.2fx", new[1] / old[1]),
                    cpu: format("%.2fx", new[2] / old[2]))
end
