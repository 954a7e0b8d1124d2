# frozen_string_literal: true

module LockManager
  module Testing
    # The threads waiting for each key, in arrival order, as the extension queues them: a release
    # hands the freed place to the first; a free key goes to a newcomer ahead of the queue unless
    # it asks to be fair. Called by the Store under its mutex; waits on its ConditionVariable.
    class Queues
      # A thread waiting for `key` (`name`: as the caller gave it) until `deadline`. `granted`: the
      # Hold a release handed it.
      Waiter = Struct.new(:key, :name, :token, :request, :started, :deadline, :granted)

      def initialize(keyspace, mutex, changed)
        @keyspace = keyspace
        @mutex = mutex
        @changed = changed
        @queues = Hash.new { |hash, key| hash[key] = [] }
      end

      # One attempt: a newcomer (no `waiter`) takes a free place ahead of the queue (fair: only when
      # nobody queues); a queued waiter takes one when no waiter queued before it is owed it.
      # @return [Hold, nil]
      def take(key, token, request, waiter: nil)
        free = request.limit - @keyspace.live(key).size
        return if free <= 0

        pending = @queues.fetch(key, []).reject(&:granted)
        if waiter
          return unless pending.index(waiter) < free
        elsif request.fair && !pending.empty?
          return
        end
        @changed.broadcast
        @keyspace.grant(key, token, request)
      end

      # Queues the caller until its turn, a hand-off, or `request.wait` seconds. A thread
      # interrupted meanwhile (Thread#raise, Timeout) leaves the queue and passes on a lock handed
      # to it.
      # @return [Hold]
      # @raise [LockNotAcquired] when the wait ran out
      def wait(key, name, token, request)
        started = Keyspace.clock
        waiter = Waiter.new(key, name, token, request, started, started + request.wait)
        @queues[key] << waiter
        loop do
          hold = waiter.granted || take(key, token, request, waiter: waiter)
          return taken(waiter, hold) if hold

          pause(waiter)
        end
      ensure
        abandon(waiter) if waiter&.request
      end

      # A release hands the freed place to the first waiter that has none yet, as the extension's
      # release script does.
      def hand_over(key)
        waiter = @queues.fetch(key, []).find { |candidate| candidate.granted.nil? } or return
        return if @keyspace.live(key).size >= waiter.request.limit

        waiter.granted = @keyspace.grant(key, waiter.token, waiter.request)
      end

      private

      # Sleeps until a change, the first holder's expiry, or the deadline.
      def pause(waiter)
        now = Keyspace.clock
        raise LockNotAcquired.new(waiter.name, now - waiter.started) if now >= waiter.deadline

        @changed.wait(@mutex, [waiter.deadline, @keyspace.next_expiry(waiter.key)].min - now)
      end

      def taken(waiter, hold)
        dequeue(waiter)
        waiter.request = nil # nothing left for `abandon` to undo
        hold
      end

      def abandon(waiter)
        dequeue(waiter)
        return unless waiter.granted

        @keyspace.delete(waiter.key, waiter.granted)
        hand_over(waiter.key)
      ensure
        @changed.broadcast
      end

      def dequeue(waiter)
        queue = @queues[waiter.key]
        queue.delete(waiter)
        @queues.delete(waiter.key) if queue.empty?
      end
    end
  end
end
