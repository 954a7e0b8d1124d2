# frozen_string_literal: true

require "securerandom"

module LockManager
  module Sidekiq
    # A queue or job set cleared through Sidekiq's API (Queue#clear, ScheduledSet, RetrySet and
    # DeadSet#clear: the Web UI's Delete and Delete All) releases the locks of the jobs it
    # removes (RemovedJobs). The jobs are taken first, in one transaction: the queue's (set's)
    # key is renamed to a key of this clear's own, so a job pushed a moment later lands in a new
    # queue, keeps its lock and stays. Then the taken jobs are read a batch at a time, each
    # batch's locks released in one round trip, and the taken key deleted.
    module ClearedJobs
      # Jobs read (and locks released) per round trip.
      BATCH = 1_000
      # Pushed before the rename, so there is always a key to rename; never read as a job.
      PLACEHOLDER = "lock_manager:placeholder"
      # Seconds the taken jobs stay if this process dies before it deletes them.
      KEEP_TAKEN = 3_600
      # Sidekiq 6.4's clear returns Redis's replies; 7 and 8's true.
      REPLIES = ::Sidekiq::VERSION.to_i < 7

      module_function

      # Takes the list or sorted set at `key` away in one MULTI, with the commands the block adds,
      # releases the locks of its jobs and deletes it.
      # @return [Array] the MULTI's replies after [EXISTS, the placeholder's push, RENAME, EXPIRE]
      def take(key, sorted:)
        taken = "lock_manager:cleared:#{key}:#{SecureRandom.hex(8)}"
        replies = ::Sidekiq.redis do |conn|
          conn.multi do |transaction|
            transaction.exists(key)
            sorted ? transaction.zadd(key, 0, PLACEHOLDER) : transaction.rpush(key, PLACEHOLDER)
            transaction.rename(key, taken)
            transaction.expire(taken, KEEP_TAKEN)
            yield transaction if block_given?
          end
        end
        release(taken, sorted)
        replies
      end

      # Releases the locks of the jobs at `taken`, a batch at a time, then deletes it. Once the
      # locks' Redis fails, the locks of the jobs not released yet expire after unique_for.
      def release(taken, sorted)
        (0..).step(BATCH) do |start|
          batch = ::Sidekiq.redis do |conn|
            sorted ? conn.zrange(taken, start, start + BATCH - 1) : conn.lrange(taken, start, start + BATCH - 1)
          end
          break if batch.empty? || !RemovedJobs.release(batch - [PLACEHOLDER])
        end
      ensure
        ::Sidekiq.redis { |conn| conn.unlink(taken) }
      end

      # Prepended to Sidekiq::Queue.
      module Queue
        def clear
          replies = ClearedJobs.take(@rname, sorted: false) { |transaction| transaction.srem("queues", [name]) }
          REPLIES ? [replies[0], replies[4].positive?] : true
        end
        # Sidekiq's alias of clear is bound to its own method.
        alias_method :💣, :clear # rubocop:disable Style/Alias -- as a bare word, Naming/AsciiIdentifiers refuses it
      end

      # Prepended to Sidekiq::JobSet: the scheduled, retry and dead sets.
      module Set
        def clear
          replies = ClearedJobs.take(name, sorted: true)
          REPLIES ? replies[0] : true
        end
        alias_method :💣, :clear # rubocop:disable Style/Alias -- as a bare word, Naming/AsciiIdentifiers refuses it
      end
    end
  end
end
