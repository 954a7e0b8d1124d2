# frozen_string_literal: true

require "json"
require "logger"
require_relative "register"

module Histories
  # The hot keys and how many may hold each at once: two plain locks and one `limit: 2`.
  KEYS = { "a" => 1, "b" => 1, "c" => 2 }.freeze
  MAX_HOLD = 0.005 # the critical section sleeps rand * MAX_HOLD before its write
  # Within the plan's `long_window`, every 4th section of process 0's `renew: true` thread is a long
  # one, below the TTL: long enough for a fault to fall inside it (Faults.await_long_section), so
  # what a lost lock allows shows, and renewal gets to say it lost it. Only then: every waiter ends
  # up queued behind such a section, and the load outside the window is the plain one.
  LONG_HOLD = (1.5..2.5)
  RETRY_AFTER = 0.005 # a refused nonblocking call or try_lock comes back after rand * RETRY_AFTER

  # What one client process needs to know: where Redis is (directly or through its proxy), the
  # register, the lock settings, and the window of load (CLOCK_MONOTONIC, the same in every process).
  # `stop_at` is the latest end; the row moves it earlier once its fault is over (Worker#run).
  Plan = Struct.new(:row, :register_url, :threads, :timeout, :wait, :start_at, :stop_at, :long_window, :dir,
                    keyword_init: true)

  # One client process: `plan.threads` threads taking locks until `plan.stop_at`, each operation
  # written as one JSON line to <dir>/p<process>.jsonl once the threads are done (a line per
  # operation as it ends would put file writes inside the timings).
  class Worker
    # @param locker_options [Hash] where the Locker finds Redis (redis_url, sentinels, cluster), and
    #   the row's own options (min_replicas)
    def initialize(plan, process, locker_options)
      @plan = plan
      @process = process
      @locker_options = locker_options
    end

    # @param stop [IO] where the row sends the load's end once its fault is over: a fault that
    #   found its moment early ends the row early (the threads read plan.stop_at at every turn)
    # @return [Integer] operations recorded
    def run(stop)
      Thread.new { (line = stop.gets) && (@plan.stop_at = [Float(line), @plan.stop_at].min) }
      LockManager.configure { |c| c.logger = Logger.new(File.join(@plan.dir, "p#{@process}.log")) }
      locker = LockManager::Locker.new(**@locker_options, key_prefix: "#{@plan.row}:", pool_size: @plan.threads)
      contenders = Array.new(@plan.threads) { |thread| Contender.new(locker, @plan, @process, thread) }
      threads = contenders.map { |contender| Thread.new { contender.run } }
      finish(threads, contenders)
    end

    private

    # Threads get until their last call's bound (wait) and a margin past the end of the load; a
    # thread still inside a call then is a stuck waiter, recorded with its operation unfinished.
    def finish(threads, contenders)
      give_up_at = @plan.stop_at + @plan.wait + 10
      threads.each { |thread| thread.join([give_up_at - Histories.now, 0].max) }
      entries = contenders.flat_map(&:entries)
      entries.concat(contenders.filter_map(&:current).map { |entry| entry.merge(outcome: "unfinished") })
      File.open(File.join(@plan.dir, "p#{@process}.jsonl"), "w") do |file|
        entries.each { |entry| file.puts(JSON.generate(entry)) }
      end
      entries.size
    end
  end

  # One thread's calls, each recorded as a Hash (an entry of its process's history). Its index
  # picks its way in: 0 blocking_lock, 1 blocking_lock with `fair: true`, 2 blocking_lock with
  # `renew: true` (in process 0, some long sections: LONG_HOLD), 3 nonblocking_lock
  # and handles (try_lock, lock) by turns. The key is picked at random each time: the `limit: 2`
  # one by any way that takes `limit:` (handles do not, nor `fair:` with it here).
  class Contender
    attr_reader :entries, :current

    def initialize(locker, plan, process, thread)
      @locker = locker
      @plan = plan
      @process = process
      @thread = thread
      @entries = []
      @current = nil
      @turn = 0
    end

    def run
      @register = Register.new(@plan.register_url, "register:#{@plan.row}")
      sleep([@plan.start_at - Histories.now, 0].max)
      while Histories.now < @plan.stop_at
        @turn += 1
        @current = new_entry((long? ? KEYS.select { |_, limit| limit == 1 } : KEYS).keys.sample)
        @entries << attempt(@current)
        @current = nil
      end
    end

    private

    def new_entry(key)
      { p: @process, t: @thread, pid: Process.pid, key: key, limit: KEYS.fetch(key), timeout: @plan.timeout,
        start: Histories.now }
    end

    # Runs one call, and records how it ended.
    def attempt(entry)
      case @thread % 4
      when 0 then blocking(entry)
      when 1 then blocking(entry, fair: entry[:limit] == 1)
      when 2 then blocking(entry, renew: true)
      else @turn.even? || entry[:limit] > 1 ? nonblocking(entry) : handle(entry)
      end
    rescue LockManager::LockNotAcquired => e
      ended(entry, "timed_out", e)
    rescue StandardError => e
      ended(entry, "error", e).tap { sleep(rand * RETRY_AFTER) } # no spinning while Redis is away
    end

    def blocking(entry, fair: false, renew: false)
      entry.merge!(api: "blocking_lock", fair: fair, renew: renew, bound: @plan.wait)
      result = @locker.blocking_lock(entry[:key], timeout: @plan.timeout, wait: @plan.wait, limit: entry[:limit],
                                                  fair: fair, renew: renew) { |lock| critical(entry, lock) }
      released(entry, result.lost?)
    end

    def nonblocking(entry)
      entry.merge!(api: "nonblocking_lock", bound: 0)
      result = @locker.nonblocking_lock(entry[:key], timeout: @plan.timeout, limit: entry[:limit]) do |lock|
        critical(entry, lock)
      end
      result.run? ? released(entry, result.lost?) : refused(entry)
    end

    # try_lock, or lock (which waits) every other time (odd turns come here), then release: the
    # handle API.
    def handle(entry)
      waits = @turn % 4 == 1
      entry.merge!(api: waits ? "lock" : "try_lock", bound: waits ? @plan.wait : 0)
      options = { timeout: @plan.timeout }
      lock = waits ? @locker.lock(entry[:key], wait: @plan.wait, **options) : @locker.try_lock(entry[:key], **options)
      return refused(entry) unless lock

      critical(entry, lock)
      released(entry, !lock.release)
    end

    # The critical section: the write to the register comes last, after a sleep, so a holder
    # stopped inside its section is most likely stopped before its write (the stale write to see).
    # A `limit: N` key is not written: its N holders are meant to run at once, and a register that
    # keeps the largest token would refuse the others. Returns the lock (the block's value).
    def critical(entry, lock)
      entry[:acquired] = Histories.now
      entry[:token] = lock.fencing_token
      sleep(long? ? rand(LONG_HOLD) : rand * MAX_HOLD)
      write(entry) if entry[:limit] == 1
      entry[:release_start] = Histories.now
      lock
    end

    # Every 4th turn of process 0's renewing thread in the long window, on a plain key (where
    # faults look for it).
    def long?
      @process.zero? && @thread % 4 == 2 && (@turn % 4).zero? && @plan.long_window.cover?(Histories.now)
    end

    def write(entry)
      entry[:write_start] = Histories.now
      answer, entry[:before] = @register.write(entry[:key], entry[:token])
      entry[:register] = answer.to_s
    rescue StandardError => e
      entry[:register] = "error: #{e.class}"
    ensure
      entry[:write_end] = Histories.now
    end

    # `lost`: what the gem said (Result#lost?, or a handle's release finding the lock gone).
    def released(entry, lost)
      entry.merge!(end: Histories.now, outcome: "acquired", lost: lost)
    end

    # Not acquired now: comes back a little later rather than spinning on the key.
    def refused(entry)
      ended(entry, "not_acquired")
      sleep(rand * RETRY_AFTER)
      entry
    end

    def ended(entry, outcome, error = nil)
      entry.merge!(end: Histories.now, outcome: outcome)
      entry[:error] = "#{error.class}: #{error.message}" if error
      entry
    end
  end

  def self.now
    Process.clock_gettime(Process::CLOCK_MONOTONIC)
  end
end
