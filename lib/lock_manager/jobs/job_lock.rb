# frozen_string_literal: true

require "digest/sha2" # Digest::SHA256 now: Digest's own lazy load of it races between threads (Ruby bug 9494)
require "json"
require_relative "conflict"
require_relative "parkable"
require_relative "until_expired"
require_relative "job_claims"

module LockManager
  # One job's lock, whichever framework runs the job (Sidekiq or ActiveJob): its key, and what its
  # `lock_with` strategy does when the job is pushed and while it runs. A unique job's lock is
  # held by the job's id, so any process can take it over, keep it for a retry, or release it.
  class JobLock
    include Parkable
    extend JobClaims

    # Where the run lock of :until_and_while_executing lives, after the job's key.
    RUN_SUFFIX = ":run"

    attr_reader :options, :key, :token, :holder
    # :until_expired: when the lock expires (epoch seconds), once UntilExpired.claiming set it.
    attr_accessor :expires_at
    # The key found held when #run returned false: `key`, or the run lock "key:run".
    attr_reader :held_key

    # @param options [JobOptions]
    # @param class_name [String] the job's own class (never a wrapper's)
    # @param args [Array] what a `key:` Proc is called with
    # @param token [String] the job's id
    # @param key_proc [Proc, nil] lock_with's `key:` Proc
    # @param digest_args [Array, Proc] the arguments as pushed (JSON), or what makes them, for the
    #   default key of until_*
    def initialize(options:, class_name:, args:, token:, key_proc: nil, digest_args: args)
      @options = options
      @token = token.to_s
      @key = key_for(class_name, args, key_proc, digest_args)
    end

    # Seconds the lock of a job scheduled `at` (epoch seconds, or nil: now) lives while it waits (for
    # :until_expired, until the expiry its first push set: UntilExpired).
    def pending_for(at, now = Time.now.to_f)
      return expires_at - now if expires_at

      options.unique_for + [at.to_f - now, 0].max
    end

    # Runs the job as its strategy says. When the job raises, `retry_in` is asked how many
    # seconds until its next try (nil: none follows): a unique job's lock is kept that long plus
    # `unique_for`, or released.
    # @return [Boolean] false when the job's lock was held by another (see #holder): it did not run
    def run(retry_in:, &block)
      case options.mode
      when "until_executing" then unclaimed { yield || true }
      when "until_and_while_executing"
        unclaimed { locked("#{key}#{RUN_SUFFIX}", &block) }
      when "until_executed" then adopted(retry_in, &block)
      when "until_expired" then yield || true
      else locked(key, &block)
      end
    end

    # Releases the enqueue lock if this job holds it (a job that will not run).
    # @return [Boolean] whether it did
    def release_claim
      LockManager.locker.release_claim(key, token)
    end

    # #release_claim where the caller cannot raise (its push failed, the job was deleted): a failure
    # is logged, and the lock expires after unique_for.
    def abandon
      release_claim
    rescue LockManager::Error => e
      LockManager.logger.warn("lock_manager: #{e.message}; the lock #{key.inspect} expires after unique_for")
    end

    private

    def key_for(class_name, args, key_proc, digest_args)
      return options.key if options.key.is_a?(String)
      return key_proc.call(*args).to_s if key_proc
      return class_name unless options.unique?

      digest_args = digest_args.call if digest_args.respond_to?(:call)
      "#{class_name}:#{Digest::SHA256.hexdigest(JSON.generate(digest_args))[0, 32]}"
    end

    def locked(key, &block)
      return parkable(key, &block) if options.park?

      if options.blocking?
        LockManager.locker.blocking_lock(key, **options.lock_options, &block)
        return true
      end
      LockManager.locker.nonblocking_lock(key, **options.lock_options, &block).run? || held_by(nil, key)
    end

    # :until_executed: the lock claimed at push becomes this run's, renewed while the job runs.
    # (An error the job itself raises, in `else`, is never taken for Redis's.)
    def adopted(retry_in, &block)
      lock = LockManager.locker.adopt(key, token, timeout: options.timeout, max_hold: options.max_hold)
    rescue LockManager::ConnectionError => e
      unlocked(e, &block)
    else
      lock.is_a?(Lock) ? run_adopted(lock, retry_in, &block) : held_by(lock)
    end

    # The enqueue lock released as the job starts, then the rest of its run.
    def unclaimed(&block)
      release_claim
    rescue LockManager::ConnectionError => e
      unlocked(e, &block)
    else
      yield
    end

    # Redis could not be asked for the job's lock: on_redis_error runs it without, or skips it.
    def unlocked(error)
      return held_by(OnRedisError::UNREACHABLE) if OnRedisError.decide(key, error) == :skip

      yield
      true
    end

    def held_by(holder, held_key = key)
      @holder = holder
      @held_key = held_key
      false
    end

    def run_adopted(lock, retry_in)
      begin
        yield
      rescue Exception => e # rubocop:disable Lint/RescueException -- the lock follows the job, the error goes on
        settle(lock) { after_failure(lock, retry_in.call(e)) }
        raise
      end
      settle(lock) { lock.release }
      true
    end

    # Kept for the next try (`seconds` from now, then unique_for as a pending job), else released.
    def after_failure(lock, seconds)
      seconds ? lock.keep(seconds + options.unique_for) : lock.release
    end

    # The job's outcome stands whatever Redis says now: a lock left behind expires by its TTL.
    def settle(lock)
      yield
    rescue LockManager::Error => e
      LockManager.logger.warn("lock_manager: #{e.message}; the lock #{lock.key.inspect} expires by its TTL")
    end
  end
end
