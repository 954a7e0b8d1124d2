# frozen_string_literal: true

require "English"
require "json"
require "rbconfig"

# Many processes of many threads asking one GCRA limiter and one fixed-window limiter as fast as they
# can, for spec/faults/limiter_faults_spec.rb (one redis-server) and spec/topologies/limiter_spec.rb
# (a Cluster). Each child is `ruby -I lib -e` with a Locker of its own (pool_size: its threads); they
# all start and stop at the same CLOCK_MONOTONIC instants (the clock is the machine's, shared by the
# processes), and report every admitted decision:
#
# - GCRA: the decision was made inside [before, after], the instants around the call. The rule says
#   that any set of admitted decisions spans at least (size - burst) / rate; a set's decisions lie
#   between its earliest `before` and its latest `after`, so checking size <= burst + rate x that
#   width never fails a correct limiter, however late a loaded machine runs a thread, and still fails
#   one that admits more (the slack is the calls' own durations, not a constant). The sets checked
#   are every run of decisions in the order their calls returned.
# - window: its receipt, the window's number Redis computed from its own clock: counts per window are
#   exact.
module LimiterHammer
  LIB = File.expand_path("../../lib", __dir__)
  # Seconds a whole window must be clear of the run's ends by (the run's clock is the client's).
  MARGIN = 0.05

  CHILD = <<~'RUBY'
    $stdout.sync = true
    require "json"
    require "lock_manager"
    options, prefix, names, threads, rule = JSON.parse(ARGV[0]).values_at("locker", "prefix", "names", "threads", "rule")
    locker = LockManager::Locker.new(**options.transform_keys(&:to_sym), key_prefix: prefix, pool_size: threads)
    rate = LockManager::Limiter.new(names[0], rate: rule["rate"], per: 1, burst: rule["burst"], locker: locker)
    window = LockManager::Limiter.window(names[1], rule["window"], per: rule["per"], locker: locker)
    # Every thread's connection made and both scripts loaded before the start, on limiters not counted.
    warm = [LockManager::Limiter.new("#{names[0]}:warm", rate: 1, per: 1, locker: locker),
            LockManager::Limiter.window("#{names[1]}:warm", 1, per: 1, locker: locker)]
    Array.new(threads) { Thread.new { warm.each(&:try_acquire) } }.each(&:join)
    puts "ready"
    start, stop = $stdin.gets.split.map(&:to_f)
    clock = -> { Process.clock_gettime(Process::CLOCK_MONOTONIC) }
    sleep(start - clock.call) if start > clock.call
    workers = Array.new(threads) do
      Thread.new do
        rates = []
        windows = []
        calls = 0
        while (before = clock.call) < stop
          rates << [before, clock.call] if rate.try_acquire.admitted?
          limit = window.try_acquire
          windows << limit.receipt.first if limit.admitted?
          calls += 2
        end
        [rates, windows, calls]
      end
    end
    rates, windows, calls = workers.map(&:value).transpose
    puts JSON.generate("rates" => rates.flatten(1), "windows" => windows.flatten, "calls" => calls.sum)
  RUBY

  # `processes` children of `threads` threads ask both limiters for `seconds`; returns a LimiterHammerRun.
  # @param locker [Hash] what the children's Locker connects to: { redis_url: } or { cluster: [seeds] }
  # @param names [Array(String, String)] the GCRA limiter's name and the window limiter's
  def hammer_limiters(locker:, names:, processes:, threads:, seconds:, rule:)
    began = monotonic
    argument = JSON.generate(locker: locker, prefix: prefix, names: names, threads: threads, rule: rule)
    children = Array.new(processes) { IO.popen([RbConfig.ruby, "-I", LIB, "-e", CHILD, argument], "r+") }
    children.each { |child| raise "a hammer child did not start" unless child.gets == "ready\n" }
    setup = monotonic - began
    start = monotonic + 0.3
    start_realtime = Process.clock_gettime(Process::CLOCK_REALTIME) + 0.3
    children.each { |child| child.puts("#{start} #{start + seconds}") }
    LimiterHammerRun.new(processes: processes, threads: threads, rule: rule, start: start, stop: start + seconds,
                         start_realtime: start_realtime, setup: setup, **reports_of(children))
  end

  # What the specs assert of a run: never more than either rule, at least `share` of what it allows.
  def expect_within_the_rules(run, share:)
    _, _, over = run.tightest_set
    warn "  #{RSpec.current_example.description[0, 50]}: #{run.summary}" if ENV["LM_FAULTS_TIMES"]

    expect(over).to be <= 1e-3 # every set of decisions within burst + rate x its span
    expect(run.rates.size).to be >= share * run.rate_allowed
    expect(run.per_window.values).to all(be <= run.rule[:window])
    expect(run.whole_windows.size).to be >= ((run.seconds - (2 * MARGIN)) / run.rule[:per]).floor - 1
    expect(run.whole_windows.map { |window| run.per_window.fetch(window, 0) }).to all(be >= share * run.rule[:window])
  end

  private

  # Every child's report, waited for, in one: rates, windows and calls.
  def reports_of(children)
    reports = children.map do |child|
      report = child.read
      child.close
      raise "a hammer child failed: #{$CHILD_STATUS.inspect}" unless $CHILD_STATUS.success?

      JSON.parse(report)
    end
    { rates: reports.flat_map { |report| report["rates"] }, windows: reports.flat_map { |report| report["windows"] },
      calls: reports.sum { |report| report["calls"] } }
  end
end

# What a LimiterHammer run reported, and what the rules allowed it: `rates` [before, after] of each
# decision the GCRA limiter admitted, `windows` the window number of each the window limiter admitted.
LimiterHammerRun = Struct.new(:processes, :threads, :rule, :start, :stop, :start_realtime, :rates, :windows, :calls,
                              :setup, keyword_init: true) do
  def seconds
    stop - start
  end

  # What the GCRA rule allows from idle over the run: burst + rate x its length.
  def rate_allowed
    rule[:burst] + (rule[:rate] * seconds)
  end

  # The longest call that returned admitted (its decision's uncertainty).
  def longest_call
    rates.map { |before, after| after - before }.max
  end

  # The set of admitted decisions that comes nearest the rule: [size, span its report allows, size - rule].
  def tightest_set
    sorted = rates.sort_by(&:last)
    best = nil
    sorted.each_index do |i|
      earliest = Float::INFINITY
      sorted[i..].each_with_index do |(before, after), n|
        earliest = before if before < earliest
        span = after - earliest
        over = n + 1 - (rule[:burst] + (rule[:rate] * span))
        best = [n + 1, span, over] if best.nil? || over > best[2]
      end
    end
    best
  end

  # Admitted per window number.
  def per_window
    windows.tally
  end

  # The windows that began and ended inside the run, whether anything was admitted in them or not
  # (its clock may differ from Redis's by what the calls took: a window must be clear of the run's
  # ends by LimiterHammer::MARGIN). A span of L seconds holds floor(L / per) - 1 of them at least, as it falls.
  def whole_windows
    per = rule[:per]
    margin = LimiterHammer::MARGIN
    (((start_realtime + margin) / per).ceil..(((start_realtime + seconds - margin) / per).floor - 1)).to_a
  end

  def summary
    size, span, over = tightest_set
    { run: "#{processes}x#{threads} #{seconds.round(2)}s", setup: setup.round(2), calls: calls,
      rate: [rates.size, rate_allowed.round(1)], longest_call: longest_call.round(3),
      tightest: [size, span.round(3), over.round(3)], windows: per_window.sort.map(&:last), whole: whole_windows.size }
  end
end
