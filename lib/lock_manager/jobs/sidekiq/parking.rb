# frozen_string_literal: true

require "digest/sha2" # Digest::SHA256 now: Digest's own lazy load of it races between threads (Ruby bug 9494)

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

      # The instance variables of a wrapped ActiveJob's serialized data (its first argument) pushed to
      # park (ActiveJob::Parking): where it parks (a Parkable::Spot), and what parking it did.
      PARK = :@lock_manager_park
      PARKED = :@lock_manager_parked

      class << self
        # Parks the job the server middleware runs (a Sidekiq job Hash) at `spot` (a Parkable::Spot).
        # @return [Array(Symbol, Integer), nil] Claims#park's reply, or nil where the job cannot park
        def park(job, spot)
          client = ::Sidekiq::Client.new
          return unless OnePush.possible?(client.redis_pool) # Sidekiq's Redis is the locks'

          payload(client, job.except("at"), spot)
        end

        # Where a wrapped ActiveJob's push asks to park (ActiveJob::Parking), or nil.
        def requested(job)
          data = Array(job["args"]).first if job["wrapped"]
          data.instance_variable_get(PARK) if data.is_a?(Hash)
        end

        # Of the payloads whose claims travel with their push (OnePush), parks those that asked to
        # (their lock is the OnePush mark), telling each what it did on its serialized data.
        # @return [Array<Hash>] the others
        def write(client, deferred)
          return deferred unless deferred.any? { |payload| requested(payload) } # no Array made for a claim

          parking, others = deferred.partition { |payload| requested(payload) }
          parking.each do |payload|
            data = payload["args"].first
            data.instance_variable_set(PARKED, payload(client, payload, data.instance_variable_get(PARK)))
          end
          others
        end

        private

        def payload(client, payload, spot)
          fallback = Unpark.fallback(spot.key, payload["queue"])
          LockManager.locker.park(spot.key, spot.token, ttl: spot.ttl, grace: GRACE, most: spot.most, limit: spot.limit,
                                                        schedule: SCHEDULE, fallback: fallback,
                                                        push: OnePush.commands(client, payload))
        end
      end
    end

    # The fallback of a lock's parked jobs, for when no release comes (the holder's process died,
    # or a job handed the lock never ran): Sidekiq's scheduler runs it when it is due, a grace after
    # the lock would have room, and it hands the lock to the first parked job, or waits again. One
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
