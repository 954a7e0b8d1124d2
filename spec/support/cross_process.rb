# frozen_string_literal: true

require "json"
require_relative "process_helpers"

# The script of CrossProcess's children (see CrossProcess).
CROSS_PROCESS_CHILD = <<~'RUBY'
  $stdout.sync = true
  require "json"
  require "lock_manager"

  keys = ENV.fetch("LM_KEYS").split(",")
  settings = { key_prefix: ENV.fetch("LM_PREFIX"), pool_size: keys.size + 1 }
  if ENV["LM_SEEDS"]
    settings[:cluster] = ENV.fetch("LM_SEEDS").split(",")
  else
    settings.merge!(sentinels: ENV.fetch("LM_SENTINELS").split(","), sentinel_master: ENV.fetch("LM_MASTER"),
                    redis_url: ENV.fetch("LM_URL"))
  end
  locker = LockManager::Locker.new(**settings)
  timeout = Float(ENV.fetch("LM_TIMEOUT", "10"))
  hold = Float(ENV.fetch("LM_HOLD", "0.1"))
  now = -> { Process.clock_gettime(Process::CLOCK_MONOTONIC) }
  out = Mutex.new
  report = ->(line) { out.synchronize { puts(line.is_a?(String) ? line : JSON.generate(line)) } }

  report.call("ready")
  $stdin.gets # "go"
  case ENV.fetch("LM_MODE")
  when "cycles"
    options = { timeout: timeout, limit: Integer(ENV.fetch("LM_LIMIT", "1")), fair: ENV["LM_FAIR"] == "1" }
    keys.map do |key|
      Thread.new do
        Integer(ENV.fetch("LM_CYCLES", "1")).times do
          locker.blocking_lock(key, **options) do |run|
            entered = now.call
            sleep hold
            left = now.call
            report.call("event" => "run", "key" => key, "entered" => entered, "left" => left,
                        "token" => run.fencing_token)
          end
        end
      end
    end.each(&:join)
  when "hold"
    inside = Queue.new
    release = Queue.new
    threads = keys.map do |key|
      Thread.new do
        started = nil
        begin
          result = locker.nonblocking_lock(key, timeout: timeout, renew: ENV["LM_RENEW"] == "1") do |run|
            started = now.call
            inside << key
            release.pop
            run.lost?
          end
        ensure
          inside << key unless started # skipped, or failed: "holding" is said all the same
        end
        { "event" => "held", "key" => key, "run" => result.run?, "token" => result.fencing_token,
          "lost_inside" => result.result, "lost" => result.lost?, "held_for" => started && (now.call - started) }
      end
    end
    keys.size.times { inside.pop }
    report.call("holding")
    $stdin.gets # "release"
    keys.size.times { release << true }
    threads.each { |thread| report.call(thread.value) }
  else
    raise "unknown LM_MODE"
  end
  report.call("done")
RUBY

# Locks taken by real processes (`ruby -I lib -e` children, see ProcessHelpers#ruby_child) on a
# topology, and the checks of what they report. An example group that includes it defines
# #topology_env: the environment that tells a child's Locker where Redis is (LM_SEEDS for a
# Cluster, or LM_SENTINELS, LM_MASTER and LM_URL for Sentinel); the key prefix is the example's.
#
# A child says "ready" once its Locker is built, and starts on "go". Then, per key of LM_KEYS, in
# a thread of its own:
# - mode "cycles": LM_CYCLES times blocking_lock(key, timeout: LM_TIMEOUT, limit: LM_LIMIT,
#   fair: LM_FAIR), holding LM_HOLD seconds; each run reported as
#   {"event" => "run", "key", "entered", "left", "token"}, then "done";
# - mode "hold": nonblocking_lock(key, timeout: LM_TIMEOUT, renew: LM_RENEW), which it holds until
#   told "release": "holding" once every key is held (or skipped), then per key
#   {"event" => "held", "key", "run", "token", "lost_inside", "lost", "held_for"}, then "done".
# Times are CLOCK_MONOTONIC, which on Linux is one clock for every process (the example's too).
module CrossProcess
  include ProcessHelpers

  # A child in `mode` on `keys` (see above), once it is ready. `settings`: timeout:, hold:,
  # cycles:, limit:, fair:, renew:.
  def lock_process(mode, keys, **settings)
    lock_processes(1, mode, keys, **settings).first
  end

  # `count` such children, started together (Ruby boots in each at the same time), once all are ready.
  def lock_processes(count, mode, keys, **settings)
    env = topology_env.merge("LM_PREFIX" => prefix, "LM_MODE" => mode, "LM_KEYS" => keys.join(","))
    settings.each { |name, value| env["LM_#{name.upcase}"] = { true => "1", false => "0" }.fetch(value, value.to_s) }
    children = Array.new(count) { ruby_child(CROSS_PROCESS_CHILD, env) }
    children.each do |child|
      line = child.gets(timeout: 20)
      raise "child #{child.pid} said #{line.inspect}, not \"ready\"" unless line == "ready"
    end
  end

  # The reports of `child` up to `marker` ("done" or "holding"), parsed.
  def reports_until(child, marker, timeout: 15)
    deadline = monotonic + timeout
    reports = []
    loop do
      line = child.gets(timeout: [deadline - monotonic, 0.01].max)
      return reports if line == marker

      reports << JSON.parse(line)
    end
  end

  # Every child's reports up to "done", each tagged with its child's index ("child"), and the
  # children's exit statuses.
  def finished_runs(children, timeout: 15)
    runs = children.each_with_index.flat_map do |child, n|
      reports_until(child, "done", timeout: timeout).map { |report| report.merge("child" => n) }
    end
    [runs, children.map { |child| child.wait(timeout: 10)&.exitstatus }]
  end

  # The most runs ({"entered", "left"}) inside at once. A run's times are taken inside its block,
  # so they lie within the time its lock was held: a count here is never more than really held.
  def peak_inside(runs)
    events = runs.flat_map { |run| [[run.fetch("entered"), 1], [run.fetch("left"), -1]] }
    events.sort.reduce([0, 0]) { |(now, most), (_, step)| [now + step, [most, now + step].max] }.last
  end

  # The pairs of runs [earlier, later] where `later` entered after `earlier` had left, yet has no
  # larger fencing token: empty when the tokens grow with every acquisition, whatever the limit.
  def token_order_violations(runs)
    runs.permutation(2).select do |earlier, later|
      later.fetch("entered") >= earlier.fetch("left") && later.fetch("token") <= earlier.fetch("token")
    end
  end

  # The runs by the time they entered, as [child, token].
  def entry_order(runs)
    runs.sort_by { |run| run.fetch("entered") }.map { |run| [run.fetch("child"), run.fetch("token")] }
  end
end
