# frozen_string_literal: true

# What the bench scripts share: a Redis to run against, a clock, percentiles and verdicts.

require "open3"
require "rbconfig"
require_relative "../lib/lock_manager"
require_relative "../spec/support/redis_server"
require_relative "../spec/support/key_slots"

$stdout.sync = true # keep what was printed if Ruby crashes
Thread.report_on_exception = false # a worker's exception surfaces through Thread#value

module Bench
  # Whether the gem takes `fair: true` yet (it is being added alongside these scripts).
  FAIR = LockManager::Locker.instance_method(:blocking_lock).parameters.include?(%i[key fair])
  FAIR_NOT_AVAILABLE = "n/a (fair: not available yet)"

  module_function

  def now(clock = Process::CLOCK_MONOTONIC)
    Process.clock_gettime(clock)
  end

  # REDIS_URL, or the URL of a throwaway redis-server on a free loopback port, stopped at exit,
  # in a session of its own as a real Redis (see RedisServer#initialize).
  # A forked child must leave with `exit!`, or it would stop that server too.
  def redis_url
    ENV.fetch("REDIS_URL") do
      server = RedisServer.new(own_session: true).start
      at_exit { server.shutdown }
      server.url
    end
  end

  # Prints where the numbers come from: Ruby, redis-server, date.
  def header(url)
    redis = Redis.new(url: url)
    puts "ruby:         #{RUBY_DESCRIPTION}"
    puts "redis-server: #{redis.info("server")["redis_version"]} (#{ENV["REDIS_URL"] ? "REDIS_URL" : "throwaway"})"
    puts "date:         #{Time.now.strftime("%F %T %z")}"
  ensure
    redis&.close
  end

  # Builds the crate's example `name` (ext/lock_manager/examples) with cargo.
  # @return [String] the path of its executable
  def example(name)
    root = File.expand_path("..", __dir__)
    path = File.join(File.expand_path(ENV.fetch("CARGO_TARGET_DIR", "target"), root), "release/examples", name)
    output, built = Open3.capture2e({ "RUBY" => RbConfig.ruby }, "cargo", "build", "--quiet", "--release",
                                    "--example", name, chdir: root)
    return path if built.success?

    # Cargo builds the library before any example: when that fails (the library is being edited),
    # the example built before is still the same program.
    abort "cannot build the #{name} example:\n#{output}" unless File.executable?(path)

    warn "cargo build failed: using the #{name} example built before (#{File.mtime(path)})"
    path
  end

  # Uncontended lock + empty block + unlock cycles on `key`: `count` of them, or as many as fit
  # before `deadline`.
  # @return [Integer] how many ran
  def lock_cycles(locker, key, count: nil, deadline: nil)
    done = 0
    while count ? done < count : now < deadline
      raise "nonblocking_lock(#{key.inspect}) did not run its block" unless locker.nonblocking_lock(key) {}.run?

      done += 1
    end
    done
  end

  # CPU seconds `redis`'s server has used so far (user + system), from INFO.
  def redis_cpu(redis)
    redis.info("cpu").values_at("used_cpu_user", "used_cpu_sys").sum(&:to_f)
  end

  # Seconds as milliseconds for a report line ("n/a" for nil: nothing measured).
  def ms(seconds)
    seconds ? format("%.1f ms", seconds * 1000) : "n/a"
  end

  # Forks a child that sends the block's value (or the exception it raised) back through a pipe.
  # @return [Array(Integer, IO)] its pid, and the end to read from
  def fork_reporting
    reader, writer = IO.pipe
    pid = fork do
      reader.close
      result = begin
        yield
      rescue StandardError => e
        e
      end
      writer.write(Marshal.dump(result))
    ensure
      exit!(0) # not exit: the at_exit handlers (stopping the throwaway redis-server) are the parent's
    end
    writer.close
    [pid, reader]
  end

  # The nearest-rank percentile: `fraction` 0.5 is the median, 0.99 the p99.
  def percentile(values, fraction)
    sorted = values.sort
    sorted[(fraction * sorted.size).ceil.clamp(1, sorted.size) - 1]
  end

  # @param at_most [Boolean] true when the target is an upper bound, false for a lower bound
  def met?(value, limit, at_most: true)
    at_most ? value <= limit : value >= limit
  end

  # "target met", or "target NOT met (by X%)" where X is how far `value` is past `limit`.
  def verdict(value, limit, at_most: true)
    return "target met" if met?(value, limit, at_most: at_most)

    format("target NOT met (by %<miss>.0f%%)", miss: (at_most ? (value / limit) - 1 : 1 - (value / limit)) * 100)
  end

  # #verdict, saying so when the floor (no Ruby in the loop) misses the target too: the target is
  # then bounded by Redis and the machine, not by the gem.
  # @param floor [Float, nil] the floor's figure (nil: not measured)
  # @param unit [String] what follows the floor's figure
  def verdict_beside_floor(value, floor, limit, at_most: true, unit: "x")
    verdict = verdict(value, limit, at_most: at_most)
    return verdict if floor.nil? || met?(value, limit, at_most: at_most) || met?(floor, limit, at_most: at_most)

    format("%<verdict>s, nor does the floor (%<floor>.2f%<unit>s)", verdict: verdict, floor: floor, unit: unit)
  end
end
