# frozen_string_literal: true

module LockManager
  # A Locker's block calls (nonblocking_lock, blocking_lock): the hot path of every lock cycle.
  # It builds no arrays or hashes, and does not make the block a Proc (see Result#yield_to);
  # events are built only when someone listens (see Instrumentation).
  module BlockCalls
    private

    # Checks the arguments of a block call, then runs the block under the lock.
    # (Positional, as every method of this hot path: keyword calls cost more.)
    # @param wait [Boolean, Float] false: one attempt; true: wait up to `timeout`; else seconds
    # @return [Result, nil] nil when the lock was taken
    def synchronize(key, timeout, limit, wait, fair, renew, max_hold, on_redis_error, &block) # rubocop:disable Metrics/ParameterLists
      raise ArgumentError, "a block is required" unless block_given?

      ttl = Arguments.milliseconds(timeout, :timeout)
      on_redis_error = on_redis_error ? Arguments.on_redis_error(on_redis_error, :on_redis_error) : self.on_redis_error
      wait = wait == true ? ttl / 1000.0 : (wait && wait.to_f) # rubocop:disable Style/SafeNavigation -- false too
      result = run_locked(Arguments.key(key), ttl, Arguments.positive_integer(limit, :limit), wait || nil,
                          Arguments.boolean(fair, :fair), renewal(renew, max_hold), on_redis_error, &block)
      check_eviction_policy unless @eviction_policy_checked
      result
    end

    # Runs the block under the lock. (One method: the block closes over its locals; parts of it
    # would cost a Proc or an object per call.)
    def run_locked(key, ttl, limit, wait, fair, renewal, on_redis_error, &block) # rubocop:disable Metrics/AbcSize, Metrics/CyclomaticComplexity, Metrics/ParameterLists
      result = raised = nil
      started = Instrumentation.started
      begin
        outcome = native.synchronize(key, ttl, wait, limit, fair, renewal) do |fencing_token, lock, contended|
          result = Result.new(true, fencing_token, lock)
          LeaseEvents.watch if lock # renewed
          Instrumentation.acquired(key, started, wait, limit, fencing_token, contended) if started # someone listens
          result.yield_to(&block)
        rescue Exception => e # rubocop:disable Lint/RescueException -- re-raised once the lock is released
          raised = e
        end
      rescue Error => e
        return not_acquired(key, e, on_redis_error, started, wait: wait, limit: limit, ran: !result.nil?, &block)
      end
      return Instrumentation.refused(key, started, wait: wait, limit: limit) if outcome.nil?

      lost = released(key, outcome, result, ttl, renewal)
      raise raised if raised

      Reports.lost(lost, on_lost: @settings[:on_lost]) if lost
      result.finish(!lost.nil?)
    end

    # The lock was not acquired: the wait ran out (LockNotAcquired), or Redis could not be reached
    # and on_redis_error says to go on without it. (`ran`: the error came after the block.)
    def not_acquired(key, error, on_redis_error, started, wait:, limit:, ran:, &block)
      raise error if ran

      Instrumentation.refused(key, started, wait: wait, limit: limit) if error.is_a?(LockNotAcquired)
      raise error unless error.is_a?(ConnectionError) && on_redis_error != :raise

      unreachable(key, error, on_redis_error, wait: wait, &block)
    end

    # After the release: its events, and what the app is told of a lost lock (nil: held to the end).
    # @return [LockLost, nil]
    def released(key, outcome, result, ttl, renewal)
      held = held_to_the_end?(key, outcome)
      Instrumentation.released(key, held) { result.ran_for }
      return if held

      lost = Reports.lost_error(key, result, ttl: ttl, renewal: renewal)
      # A loss the renewal found was reported when it found it.
      Instrumentation.lost(key, result.ran_for, lost) unless result.lost? && LeaseEvents.watching?
      lost
    end

    # The extension's word on the release after the block: true or false, or [held, problem]
    # when the release failed (logged: it cannot change what the block did).
    def held_to_the_end?(key, outcome)
      return outcome unless outcome.is_a?(Array)

      held, problem = outcome
      Reports.release_failed(key, problem)
      held
    end

    # Redis could not be reached before the block ran: with :run the block runs unlocked, with
    # :skip the lock counts as taken (blocking_lock raises LockNotAcquired, with the error as cause).
    def unreachable(key, error, on_redis_error, wait:, &block)
      Reports.unreachable(key, error, on_redis_error)
      Instrumentation.refused(key, Instrumentation.started, wait: wait, limit: nil, error: error)
      if on_redis_error == :skip
        return unless wait

        raise LockNotAcquired.new(key), "lock #{key.inspect} was not acquired: Redis could not be reached " \
                                        "(on_redis_error: :skip)"
      end
      result = Result.new(true)
      result.yield_to(&block)
      result.finish(false)
    end
  end
end
