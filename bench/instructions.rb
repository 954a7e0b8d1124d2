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
# What is checked leaves out two things that make the same work count differently: garbage collection
# (the worker runs the operations with the collector stopped, and prints the objects they allocate,
# which are checked instead), and glibc's string functions (memset, memcpy, memcmp...), whose code
# glibc picks by the CPU it loads on (a vector loop or `rep stosb`, AVX2 or EVEX); the redis crate's
# reader zeroes up to 8 KiB before every read, 13,600 instructions of a cycle here. They are reported
# beside the rest. The figures are x86_64's; elsewhere --check says so and checks nothing.

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
# One object more per operation is a change; less than half of one is a reply read in two parts.
OBJECTS_MARGIN = 0.5
CHECKED = %w[uncontended unique_push].freeze
CHECK = ARGV.include?("--check")

# glibc's string functions, as it names the variant it picked for this CPU at load time.
STRING_FUNCTION = /\A__(?:mem|str|stp|wcs|wmem|raw)\w*_(?:sse2|ssse3|sse4|avx|evex|erms)/

# Per operation: all instructions, those in glibc's string functions (which vary by CPU), and the Ruby
# objects allocated (the worker runs the operations with the collector stopped, and counts them).
Count = Struct.new(:all, :strings, :objects) do
  # What --check compares: the same on every x86_64 machine for the same binaries and work.
  def checked = all - strings
end

# Instructions of one run of `command` (every thread of the process).
# @return [Count]
def instructions(*command)
  Dir.mktmpdir("lm-callgrind") do |dir|
    out = File.join(dir, "callgrind.out")
    output, status = Open3.capture2e({ "RUBYOPT" => nil }, "valgrind", "--tool=callgrind",
                                     "--callgrind-out-file=#{out}", *command)
    abort "callgrind failed (#{command.join(" ")}):\n#{output}" unless status.success?
    CallgrindCosts.read(out).tap { |count| count.objects = Integer(output[/^allocated (\d+)$/, 1] || 0) }
  end
rescue Errno::ENOENT
  abort "valgrind is not installed: bin/setup installs it (apt-get install valgrind)"
end

# A callgrind output's summary, and the own cost of the functions STRING_FUNCTION names: the cost
# lines under their `fn=`, less the line after each `calls=` (that is the callee's inclusive cost).
# Names are compressed: `fn=(id) name` the first time, in `fn=` or `cfn=`, then `fn=(id)`.
class CallgrindCosts
  def self.read(file)
    new.tap { |costs| File.foreach(file) { |line| costs.take(line) } }.count
  end

  attr_reader :count

  def initialize
    @names = {}
    @count = Count.new(0, 0, 0)
    @counting = @call = false
  end

  def take(line)
    if line.start_with?("fn=", "cfn=") then function(line)
    elsif line.start_with?("calls=") then @call = true
    elsif line.match?(/\A[0-9+*-]/) then cost(line)
    elsif line.start_with?("summary: ") then @count.all = Integer(line.split[1])
    end
  end

  private

  def function(line)
    kind, id, name = line.match(/\A(c?)fn=\((\d+)\)(?: (.*))?/).captures
    @names[id] = name if name
    @counting = STRING_FUNCTION.match?(@names.fetch(id)) if kind.empty?
  end

  def cost(line)
    @count.strings += Integer(line.split[1]) if @counting && !@call
    @call = false
  end
end

# Instructions per operation: a run of `count` operations less a run of none.
# @return [Count]
def per_operation(count)
  busy = instructions(*yield(count))
  idle = instructions(*yield(0))
  all, strings, objects = busy.to_a.zip(idle.to_a).map { |b, i| (b - i).fdiv(count) }
  Count.new(all.round, strings.round, objects.round(2))
end

def gem_per_operation(lib, url, workload, count)
  per_operation(count) { |n| [RbConfig.ruby, "-I", lib, WORKER, url, workload, n.to_s] }
end

def floor_per_cycle(floor, url)
  per_operation(CYCLES) { |n| [floor, url, "0", "1", n.to_s] }
end

WORKLOADS = { "uncontended" => CYCLES, "handoff" => CYCLES, "plain_push" => PUSHES, "unique_push" => PUSHES }.freeze

# @return [Hash{String => Count}] instructions per operation of each workload (CHECK: the checked ones)
def measure(lib, url)
  WORKLOADS.filter_map do |workload, count|
    next if CHECK && !CHECKED.include?(workload)

    [workload, gem_per_operation(lib, url, workload, count)]
  end.to_h
end

ROW = "  %-18<name>s %9<all>s %9<checked>s %9<strings>s %8<objects>s  %<note>s"

def row(name, count, note = "")
  puts format(ROW, name: name, all: count.all, checked: count.checked, strings: count.strings,
                   objects: count.objects ? format("%.2f", count.objects) : "", note: note).rstrip
end

def report(lib, counts, floor)
  puts lib
  puts format(ROW, name: "per operation", all: "all", checked: "checked", strings: "strings", objects: "objects",
                   note: "").rstrip
  row("floor (Rust) cycle", Count.new(floor.all, floor.strings, nil))
  uncontended = counts["uncontended"]
  row("uncontended cycle", uncontended, format("%.2fx the floor's", uncontended.all.fdiv(floor.all)))
  row("hand-off", counts["handoff"]) if counts["handoff"]
  plain = counts["plain_push"]
  row("plain push", plain) if plain
  unique = counts["unique_push"]
  row("unique push", unique, plain ? format("%.2fx a plain push", unique.all.fdiv(plain.all)) : "")
end

# Why the figures cannot be checked here, or nil.
def not_checkable
  valgrind = system("valgrind", "--version", out: File::NULL, err: File::NULL)
  return "valgrind is not installed (bin/setup installs it, as root)" unless valgrind

  cpu = RbConfig::CONFIG["host_cpu"]
  "bench/instructions.yml holds x86_64's figures, and this is #{cpu}" unless cpu == "x86_64"
end

# @return [Array<String>] what is past its figure (empty: nothing)
def check(counts)
  figures = FIGURES.fetch(Stack.ruby) do
    puts "  no figures for Ruby #{Stack.ruby} in bench/instructions.yml: nothing checked"
    return []
  end
  CHECKED.flat_map do |name|
    figure = figures[name] or next puts("  #{name}: no figure for Ruby #{Stack.ruby}, not checked") || []
    instructions = figure.fetch("instructions")
    counts[name] = least(name, counts.fetch(name), instructions)
    [past(name, "instructions", counts[name].checked, instructions, instructions * TOLERANCE),
     past(name, "objects", counts[name].objects, figure.fetch("objects"), OBJECTS_MARGIN)].compact
  end
end

# Noise only adds (a reply read in two parts, a wait): over its figure, the least of three counts.
def least(name, count, figure)
  2.times do
    break if count.checked <= figure * (1 + TOLERANCE)

    again = gem_per_operation(LIBS.first, URL, name, WORKLOADS.fetch(name))
    count = again if again.checked < count.checked
  end
  count
end

# Prints a count against its figure; what is more than `margin` over it, or nil.
def past(name, what, count, figure, margin)
  ratio = count.fdiv(figure)
  puts format("  %-12<name>s %<count>9s %<what>s, %<ratio>.3fx the figure (%<figure>s)",
              name: name, count: count, what: what, ratio: ratio, figure: figure)
  if count < figure - margin
    puts "  #{name}: #{what} below the figure by more than #{margin.round(1)}: commit the new figure"
  end
  return if count <= figure + margin

  format("%<name>s: %<count>s %<what>s, %<over>.1f %% over its figure (%<figure>s; bench/instructions.yml)",
         name: name, count: count, what: what, over: (ratio - 1) * 100, figure: figure)
end

if CHECK && (why = not_checkable)
  puts "instructions: not checked: #{why}"
  exit
end
URL = Bench.redis_url
Bench.header(URL)
floor = floor_per_cycle(Bench.example("floor"), URL)
puts "callgrind: instructions per operation, client side (every thread); #{CYCLES} cycles, #{PUSHES} pushes"
puts "(checked: what --check compares, all less glibc's string functions, which differ by CPU;"
puts " objects: Ruby objects allocated, the collector stopped while the operations run)"
results = LIBS.to_h do |lib|
  counts = measure(lib, URL)
  report(lib, counts, floor)
  [lib, counts]
end
if LIBS.size == 2
  a, b = results.values
  ratios = a.keys.map do |name|
    format("%<name>s %<ratio>.3fx", name: name, ratio: b[name].checked.fdiv(a[name].checked))
  end
  puts "B/A, outside string functions: #{ratios.join(", ")}"
end
if CHECK
  puts "checked against bench/instructions.yml (Ruby #{Stack.ruby}, at most #{(TOLERANCE * 100).round} % over):"
  past = check(results.values.first)
  abort "instructions past their figure:\n  #{past.join("\n  ")}" if past.any?
end
