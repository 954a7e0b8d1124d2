# frozen_string_literal: true

module Histories
  # The faults, each injected once per row while the load runs. Each returns what it did as
  # fault records for the Checker: kind, start, end (CLOCK_MONOTONIC), and pid when it targets one
  # client process. Every fault is bounded: it ends by itself after `seconds`.
  #
  # `target` is what a row gives a fault to act on: where the locks live (Backends), a client of
  # its lock keys, the row's key prefix, the client pids, the partitioned process's proxy, and how
  # long a fault may wait for its moment (a holder to stop, a long section to fall into).
  Target = Struct.new(:backend, :admin, :prefix, :pids, :proxy, :await, keyword_init: true)

  module Faults
    module_function

    # SIGSTOPs a client process while one of its threads holds a plain lock, for `seconds`, then
    # SIGCONTs it. `holder`:
    # - :long_section: process 0 inside one of its long sections (see #await_long_section). Past the
    #   TTL this is the Kleppmann pause: the lock expires (its renewal is stopped too), another
    #   client takes it, and the stopped one, resumed, finishes its section and writes with its old
    #   token, which the register must refuse.
    # - :fresh: any other process, whose sections last 5 ms: it is stopped within the first few ms
    #   of its block, or between being handed the lock and extending it, when its lock must still
    #   have its whole timeout ahead (docs/guarantees.md), so a pause below the TTL overlaps nothing.
    def pause_holder(target, seconds, holder)
      during = await_long_section(target) if holder == :long_section
      pid, stopped_at = stop_a_holder(target, holder == :long_section ? target.pids.first(1) : target.pids.drop(1))
      return [] unless pid

      sleep([stopped_at + seconds - Histories.now, 0].max)
      Process.kill(:CONT, pid)
      [{ kind: "sigstop", pid: pid, stopped: true, during: during, start: stopped_at, end: Histories.now }]
    end

    # SIGKILL, `seconds` down, then the same server started again on its port (with its
    # append-only file, when the row keeps one).
    def kill_restart(target, seconds)
      during = await_long_section(target)
      started = Histories.now
      target.backend.server.kill
      sleep(seconds)
      target.backend.server.start
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

    # Waits (target.await at most) until process 0's long holder (Worker's LONG_HOLD) is 100 ms
    # into a long section of a plain lock: the same token of that process on the key for 100 ms,
    # where a short section lasts 5 ms; a token already there at the first look is left out (it
    # may be near its end). The fault then falls inside a section with 1.4 s or more ahead of it, the case that
    # shows what a lost lock allows; without one, the fault comes anyway.
    # @return [String, nil] the section it fell into
    def await_long_section(target)
      deadline = Histories.now + target.await
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
    # still does; else resumes it and looks again. Gives up after target.await (the row then says
    # that it found no holder: no fault record).
    # @return [Array(Integer, Float), nil] the pid and when it was stopped
    def stop_a_holder(target, pids)
      deadline = Histories.now + target.await
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

    # The tokens holding the plain locks now (a token names its pid: docs/design.md). One GET
    # each: on a Cluster the keys may live on different masters.
    def plain_tokens(target)
      plain_keys(target).filter_map { |key| target.admin.get(key) }
    end

    def plain_keys(target)
      KEYS.select { |_, limit| limit == 1 }.keys.map { |key| "#{target.prefix}#{key}" }
    end
  end
end
