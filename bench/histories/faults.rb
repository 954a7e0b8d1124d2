# frozen_string_literal: true

module Histories
  # The faults, each injected once per row while the load runs. Each returns what it did as
  # fault records for the Checker: kind, start, end (CLOCK_MONOTONIC), and pid when it targets one
  # client process. Every fault is bounded: it ends by itself after `seconds`.
  #
  # `target` is what a row gives a fault to act on: the lock server (FaultyRedisServer), an admin
  # client of it, the row's key prefix, the client pids, and the partitioned process's proxy.
  Target = Struct.new(:server, :admin, :prefix, :pids, :proxy, keyword_init: true)

  module Faults
    # The longest a fault waits for its moment (a holder to stop, a long section to fall into).
    AWAIT = 2.0

    module_function

    # SIGSTOPs a client process while one of its threads holds a plain lock, for `seconds`, then
    # SIGCONTs it. Past the TTL this is the Kleppmann pause: the lock expires, another client takes
    # it, and the stopped one, resumed, finishes its section and writes with its old token.
    # `among: :short_sections` leaves out process 0, whose long sections (Worker's LONG_HOLD) may
    # have used most of their lock's time already: a holder is then stopped within the first few
    # ms of its block (or between being handed the lock and extending it), when its lock must
    # still have its whole timeout ahead (docs/guarantees.md).
    def pause_holder(target, seconds, among = :any)
      pids = among == :short_sections ? target.pids.drop(1) : target.pids
      pid, stopped_at = stop_a_holder(target, pids)
      return [] unless pid

      sleep([stopped_at + seconds - Histories.now, 0].max)
      Process.kill(:CONT, pid)
      [{ kind: "sigstop", pid: pid, stopped: true, start: stopped_at, end: Histories.now }]
    end

    # SIGKILL, `seconds` down, then the same server started again on its port (with its
    # append-only file, when the row keeps one).
    def kill_restart(target, seconds)
      during = await_long_section(target)
      started = Histories.now
      target.server.kill
      sleep(seconds)
      target.server.start
      [{ kind: "sigkill", during: during, start: started, end: Histories.now }]
    end

    # CLIENT PAUSE ALL for `seconds`: Redis answers nobody (and expires nothing) meanwhile.
    def client_pause(target, seconds)
      during = await_long_section(target)
      started = Histories.now
      target.admin.call("CLIENT", "PAUSE", (seconds * 1000).round, "ALL")
      sleep([started + seconds - Histories.now, 0].max)
      [{ kind: "client pause", during: during, start: started, end: Histories.now }]
    end

    # The proxied client process cut off from Redis for `seconds`; then the held bytes pass
    # (`then: :resume`) or every connection is reset (`then: :reset`).
    def partition(target, seconds, after)
      during = await_long_section(target)
      started = Histories.now
      target.proxy.blackhole
      sleep(seconds)
      after == :reset ? target.proxy.reset : target.proxy.resume
      [{ kind: "partition", pid: target.pids.first, during: during, start: started, end: Histories.now }]
    end

    # Waits (AWAIT at most) until process 0's long holder (Worker's LONG_HOLD) is 100 ms into a
    # long section of a plain lock: the same token of that process on the key for 100 ms, where a
    # short section lasts 5 ms; a token already there at the first look is left out (it may be near
    # its end). The fault then falls inside a section with 1.4 s or more ahead of it, the case that
    # shows what a lost lock allows; without one, the fault comes anyway.
    # @return [String, nil] the section it fell into
    def await_long_section(target)
      deadline = Histories.now + AWAIT
      seen = plain_tokens(target).to_h { |token| [token, Float::INFINITY] }
      while Histories.now < deadline
        held = plain_tokens(target).select { |token| token.split("/")[1].to_i == target.pids.first }
        return "a long section of pid #{target.pids.first}" if held.any? { |token| held_long?(seen, token) }

        sleep 0.01
      end
      nil
    end

    # Whether `token` was first seen 100 ms ago or more (and notes when it was seen first; a
    # token seen at the first look never counts).
    def held_long?(seen, token)
      seen[token] ||= Histories.now
      Histories.now - seen[token] >= 0.1
    end

    # Stops one of `pids` that holds one of the plain locks and checks, once it is stopped, that it
    # still does; else resumes it and looks again. Gives up after AWAIT (the row then says that it
    # found no holder: no fault record).
    # @return [Array(Integer, Float), nil] the pid and when it was stopped
    def stop_a_holder(target, pids)
      deadline = Histories.now + AWAIT
      while Histories.now < deadline
        pid = holder_pid(target, pids)
        if pid
          stopped_at = Histories.now
          Process.kill(:STOP, pid)
          return [pid, stopped_at] if holder_pid(target, pids) == pid

          Process.kill(:CONT, pid)
        end
        sleep 0.001
      end
      nil
    end

    def holder_pid(target, pids)
      plain_tokens(target).map { |token| token.split("/")[1].to_i }.find { |pid| pids.include?(pid) }
    end

    # The tokens holding the plain locks now (a token names its pid: docs/design.md).
    def plain_tokens(target)
      plain = KEYS.select { |_, limit| limit == 1 }.keys
      target.admin.mget(*plain.map { |key| "#{target.prefix}#{key}" }).compact
    end
  end
end
