# frozen_string_literal: true

module LockManager
  # on_redis_error for jobs and Lockable: what a caller does when Redis cannot be asked for its
  # lock, as the Locker's setting says (:raise, :run without the lock, :skip as if held).
  module OnRedisError
    # The holder named when Redis could not be asked (:skip).
    UNREACHABLE = "unknown (Redis unreachable)"

    module_function

    # @return [Symbol] :run or :skip (logged)
    # @raise `error` with :raise
    def decide(key, error, locker = LockManager.locker)
      on_redis_error = locker.on_redis_error
      raise error if on_redis_error == :raise

      Reports.unreachable(key, error, on_redis_error)
      on_redis_error
    end

    # The block's claim replies, or, when Redis could not be reached, nil (:run: claimed) or
    # UNREACHABLE (:skip: held) for each of `count` jobs.
    def claiming(key, count)
      yield
    rescue ConnectionError => e
      Array.new(count, decide(key, e) == :run ? nil : UNREACHABLE)
    end
  end
end
