# frozen_string_literal: true

module LockManager
  # The run of a job with on_conflict: :park (see JobLock#run). Its lock (a place of it, with
  # limit: N) is held by the job's id, so that a release can hand it to a parked job, which takes it
  # over here by that id (or takes it, when free); its own release hands it on to the next parked job.
  module Parkable
    # Where a job parks (Claims#park): the lock, a semaphore when `limit` > 1 (a concurrency rule's
    # places); the token a release hands it to (the job's id); how long it lives handed over, in
    # seconds, until the job takes it over; how many jobs may park there at most (nil: no limit).
    Spot = Struct.new(:key, :token, :ttl, :most, :limit)

    # Where this job parks: on its lock, which it holds by its id.
    def parking_spot
      Spot.new(held_key, token, options.timeout, options.park_limit, options.limit)
    end

    private

    # @return [Boolean] false when another holds the lock (JobLock#holder says who): the job parks
    def parkable(key, &block)
      lock = LockManager.locker.adopt(key, token, timeout: options.timeout, max_hold: options.max_hold,
                                                  limit: options.limit)
    rescue LockManager::ConnectionError => e
      unlocked(e, &block)
    else
      return held_by(lock, key) unless lock.is_a?(Lock)

      begin
        yield
      ensure
        settle(lock) { lock.release_parked }
      end
      true
    end
  end
end
