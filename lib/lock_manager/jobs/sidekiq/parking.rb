# frozen_string_literal: true

require "digest"

module LockManager
  module Sidekiq
    # on_conflict: :park. A job that finds its lock held waits in Redis, behind those parked before
    # it, and the release of the lock hands the lock to the first of them and pushes it to its
    # queue, in the release's own round trip (docs/jobs.md). Its push is Sidekiq's own commands for
    # the job as it ran (its jid, arguments and retry state), so the lock's Redis must be
    # Sidekiq's, as for the claim in the push (OnePush).
    module Parking
      # Seconds past the lock's expiry that the fallback (Unpark) waits for a release.
      GRACE = 1
      # Sidekiq's sorted set of scheduled jobs, where the fallback waits.
      SCHEDULE = "schedule"

      # @return [Array(Symbol, Integer), nil] Claims#park's reply, or nil where the job cannot park
      def self.park(job, lock)
        client = ::Sidekiq::Client.new
        return unless OnePush.possible?(client.redis_pool)

        push = OnePush.commands(client, job.except("at"))
        LockManager.locker.park(lock.held_key, lock.token, ttl: lock.options.timeout, grace: GRACE,
                                                           most: lock.options.park_limit, schedule: SCHEDULE,
                                                           fallback: Unpark.fallback(lock.held_key, job["queue"]),
                                                           push: push)
      end
    end

    # The fallback of a lock's parked jobs, for when no release comes (the holder's process died,
    # or a job handed the lock never ran): Sidekiq's scheduler runs it when it is due, a grace after
    # the lock would expire, and it hands a free lock to the first parked job, or waits again. One
    # per lock and queue: every hand-over moves it later, so a line that moves never runs it.
    class Unpark
      include ::Sidekiq::Worker

      # The fallback's member of Sidekiq's schedule: the same bytes for the same lock and queue.
      def self.fallback(key, queue)
        jid = Digest::SHA256.hexdigest("#{queue}\0#{key}")[0, 24]
        ::Sidekiq.dump_json("class" => name, "args" => [key], "queue" => queue, "jid" => jid)
      end

      def perform(key)
        LockManager.locker.unpark(key)
      end
    end
  end
end
