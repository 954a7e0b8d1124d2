# frozen_string_literal: true

# Instructions the client spends per operation, counted by valgrind's callgrind: repeatable on a busy
# machine, where timings are not. Each count is a whole process that makes N operations, less one that
# makes none (start-up, connecting, the warm-up operation), divided by N.
#
#   bundle exec ruby bench/instructions.rb            # report (rake bench:instructions)
#   bundle exec ruby bench/instructions.rb --check    # and fail past bench/instructions.yml (rake test)
#   LIBS=/path/a/lib,lib bundle exec ruby bench/instructions.rb   # A/B: another checkout's lib/ (built)
#
# Per lib: the uncontended cycle (nonblocking_lock, one thread) beside the Rust floor's
# (ext/lock_manager/examples/floor.rs: the same two round trips with no pool, no Ruby, no GVL), a
# hand-off between two threads, and Sidekiq's perform_async of a plain job and of a unique
# (until_executed) job, accepted. CYCLES (default 2000) and PUSHES (default 1000) per count.
#
# --check compares this Ruby's uncontended cycle and unique push with the figures committed in
# bench/instructions.yml, and exits 1 when one is more than TOLERANCE over its figure: a change that
# costs CPU is seen the day it lands, and a deliberate cost is a commit of the new figure with its
# reason. The hand-off is reported, not checked: the waits in it make its count vary by a few percent.
# The figures are per CPU (the file's keys): glibc picks its memset and memcpy by the CPU's features,
# and those run thousands of instructions per cycle. On a CPU the file does not name, --check says so
# and checks nothing; count its figures there with `rake bench:instructions`, or compare two
# checkouts with LIBS.

require "open3"
require "tmpdir"
require "yaml"
require_relative "support"
require_relative "../spec/support/stack"

CYCLES = Integer(ENV.fetch("CYCLES", "2000"))
PUSHES = Integer(ENV.fetch("PUSHES", "1000"))
LIBS = ENV.fetch("LIBS", File.expand_path("../lib", __dir__)).split(",").map { |lib| File.expand_path(lib) }
WORKER = File.expand_path("instructions_worker.rb", __dir__)
FIGURES = YAML.safe_load_file(File.expand_path("instructions.yml", __dir__))
TOLERANCE = 0.02
CHECKED = %w[uncontended unique_push].freeze
CHECK = ARGV.include?("--check")

# Instructions of one run of `command` (every thread of the process), from callgrind's summary.
def instructions(*command)
  Dir.mktmpdir("lm-callgrind") do |dir|
    out = File.join(dir, "callgrind.out")
    output, status = Open3.capture2e({ "RUBYOPT" => nil }, "valgrind", "--tool=callgrind",
                                     "--callgrind-out-file=#{out}", *command)
    abort "callgrind failed (#{command.join(" ")}):\n#{output}" unless status.success?
    Integer(File.read(out)[/^summary: (\d+)/, 1])
  end
rescue Errno::ENOENT
  abort "valgrind is not installed: bin/setup installs it (apt-get install valgrind)"
end

# Instructions per operation: a run of `count` operations less a run of none.
def per_operation(count)
  (instructions(*yield(count)) - instructions(*yield(0))).fdiv(count).round
end

def gem_per_operation(lib, url, workload, count)
  per_operation(count) { |n| [RbConfig.ruby, "-I", lib, WORKER, url, workload, n.to_s] }
end

def floor_per_cycle(floor, url)
  per_operation(CYCLES) { |n| [floor, url, "0", "1", n.to_s] }
end

WORKLOADS = { "uncontended" => CYCLES, "handoff" => CYCLES, "plain_push" => PUSHES, "unique_push" => PUSHES }.freeze

# @return [Hash{String => Integer}] instructions per operation of each workload (CHECK: the checked ones)
def measure(lib, url)
  WORKLOADS.filter_map do |workload, count|
    next if CHECK && !CHECKED.include?(workload)

    [workload, gem_per_operation(lib, url, workload, count)]
  end.to_h
end

def report(lib, counts, floor)
  puts lib
  puts format("  uncontended cycle %9<u>d  floor %<f>d: %<r>.2fx the floor", u: counts["uncontended"], f: floor,
                                                                             r: counts["uncontended"].fdiv(floor))
  puts format("  hand-off          %9<h>d", h: counts["handoff"]) if counts["handoff"]
  unique = counts["unique_push"]
  plain = counts["plain_push"]
  beside = plain ? format("  plain push %<p>d: %<r>.2fx a plain push", p: plain, r: unique.fdiv(plain)) : ""
  puts format("  unique push       %9<u>d%<beside>s", u: unique, beside: beside)
end

# The CPU as far as glibc's choice of string functions goes: its model, and the features it picks by.
def cpu
  info = File.read("/proc/cpuinfo")
  flags = info[/^flags\s*:(.*)$/, 1].to_s.split & %w[avx avx2 avx512bw avx512f avx512vl bmi2 erms fsrm]
  "#{info[/^model name\s*:\s*(.*)$/, 1]}; #{flags.sort.join(" ")}"
rescue SystemCallError
  "unknown"
end

# Why the figures cannot be checked here, or nil.
def not_checkable
  valgrind = system("valgrind", "--version", out: File::NULL, err: File::NULL)
  return "valgrind is not installed (bin/setup installs it, as root)" unless valgrind

  return if FIGURES.key?(cpu)

  "bench/instructions.yml has no figures for this CPU (#{cpu}); it has #{FIGURES.keys.join(" and ")}"
end

# @return [Array<String>] what is past its figure (empty: nothing)
def check(counts)
  figures = FIGURES.fetch(cpu).fetch(Stack.ruby) do
    puts "  no figures for Ruby #{Stack.ruby} in bench/instructions.yml: nothing checked"
    return []
  end
  CHECKED.filter_map do |name|
    figure = figures[name] or next puts("  #{name}: no figure for this CPU and Ruby, not checked")
    2.times do # noise only adds (a reply read in two parts, a wait): over the figure, the least of three
      break if counts.fetch(name) <= figure * (1 + TOLERANCE)

      counts[name] = [counts[name], gem_per_operation(LIBS.first, URL, name, WORKLOADS.fetch(name))].min
    end
    ratio = counts.fetch(name).fdiv(figure)
    puts format("  %-12<name>s %<count>d instructions, %<ratio>.3fx the figure (%<figure>d)",
                name: name, count: counts[name], ratio: ratio, figure: figure)
    if ratio < 1 - TOLERANCE
      puts "  #{name}: below its figure by more than #{(TOLERANCE * 100).round} %: commit the new figure"
    end
    next if ratio <= 1 + TOLERANCE

    format("%<name>s: %<count>d instructions, %<over>.1f %% over its figure (%<figure>d; bench/instructions.yml)",
           name: name, count: counts[name], over: (ratio - 1) * 100, figure: figure)
  end
end

if CHECK && (why = not_checkable)
  puts "instructions: not checked: #{why}"
  exit
end
URL = Bench.redis_url
Bench.header(URL)
floor = floor_per_cycle(Bench.example("floor"), URL)
puts "callgrind: instructions per operation, client side (every thread); #{CYCLES} cycles, #{PUSHES} pushes"
results = LIBS.to_h do |lib|
  counts = measure(lib, URL)
  report(lib, counts, floor)
  [lib, counts]
end
if LIBS.size == 2
  a, b = results.values
  ratios = a.keys.map { |name| format("%<name>s %<ratio>.3fx", name: name, ratio: b[name].fdiv(a[name])) }
  puts "B/A: #{ratios.join(", ")}"
end
if CHECK
  puts "checked against bench/instructions.yml (Ruby #{Stack.ruby}, at most #{(TOLERANCE * 100).round} % over):"
  past = check(results.values.first)
  abort "instructions past their figure:\n  #{past.join("\n  ")}" if past.any?
end
