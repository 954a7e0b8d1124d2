# frozen_string_literal: true

# The jobs of spec/sidekiq/parking_spec.rb, loaded by `sidekiq -r`: each records its work on the
# timeline (demo/timeline.rb), so the spec reads what ran, when, and how many at once.
require_relative "../../demo/jobs"

require_relative "fast_poll" # scheduled jobs come back within about a second

# A job of these whose `seconds` is a String works until the spec opens that gate (sets the key
# "<timeline>:gate:<name>"; 60 s at most): a holder that holds until the jobs behind it have parked,
# however slowly a loaded machine pushes and fetches them.
module GatedWork
  include RecordedWork

  private

  def sleep(seconds)
    return super unless seconds.is_a?(String)

    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 60
    until Sidekiq.redis { |redis| redis.call("EXISTS", "#{Timeline::KEY}:gate:#{seconds}") }.to_i == 1
      break if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline

      super(0.01)
    end
  end
end

# Jobs of one account wait for each other in Redis; the lock lives 3 s, renewed while a job runs.
class ParkedWorker
  include LockManager::Worker
  include GatedWork
  lock_with :nonblocking, key: ->(account, *) { "parked:#{account}" }, on_conflict: :park, timeout: 3

  def perform(account, seconds)
    work(seconds, "parked done", [account, seconds])
  end
end

# At most two wait; the others are skipped.
class LimitedParkWorker
  include LockManager::Worker
  include GatedWork
  lock_with :nonblocking, key: "limited-park", on_conflict: :park, park_limit: 2, timeout: 3

  def perform(number, seconds)
    work(seconds, "limited done", [number, seconds])
  end
end

# Unique while pending; running, its duplicates of the same arguments wait for it.
class UniqueParkWorker
  include LockManager::Worker
  include GatedWork
  lock_with :until_and_while_executing, unique_for: 60, on_conflict: :park, timeout: 3

  def perform(number)
    work("unique-#{number}", "unique done", [number]) # the spec opens the gate once a duplicate parked
  end
end

# At most two at once; the others wait in Redis for a place, which each job's end hands on: by a
# concurrency rule, or by a lock of two places.
class ThrottledParkWorker
  include LockManager::Worker
  include RecordedWork
  throttle_with concurrency: 2, key: "park-tenant", on_limit: :park, timeout: 3

  def perform(number, seconds)
    work(seconds, "throttled done", [number, seconds])
  end
end

class PlacesParkWorker
  include LockManager::Worker
  include RecordedWork
  lock_with :nonblocking, key: "park-places", limit: 2, on_conflict: :park, timeout: 3

  def perform(number, seconds)
    work(seconds, "places done", [number, seconds])
  end
end
