# frozen_string_literal: true

require_relative "../../lock_manager"

module LockManager
  # For controllers, models and services: the pattern Rails apps call `with_semaphore_lock`, on
  # the gem's own pool (not Rails.cache), releasing only its own lock.
  #
  #   include LockManager::Lockable
  #   with_semaphore_lock("lesson_session:#{uuid}", ttl: 10, release: :after_commit) do |status, fencing_token|
  #     status == :locked ? create_the_record : head(:no_content)
  #   end
  #
  # `with_lock` is the same method under the seed's name, defined only where nothing has one:
  # never on an ActiveRecord model, whose `with_lock` takes a row lock.
  module Lockable
    RELEASES = %i[after_block after_commit].freeze

    def self.included(base)
      base.include(WithLock) unless base.method_defined?(:with_lock) || base.private_method_defined?(:with_lock)
    end

    def self.extended(base)
      base.extend(WithLock) unless base.respond_to?(:with_lock, true)
    end

    # Yields :locked and the fencing token while holding the lock, or :skipped (and nil) when
    # another holds it (for `wait` seconds, when given).
    # @param ttl [Numeric] seconds the lock lives (renewed while the block runs with `renew: true`)
    # @param wait [false, true, Numeric] false: one attempt; true: wait up to ttl; seconds: wait that long
    # @param limit [Integer] how many may hold the key at once
    # @param release [Symbol] :after_block, or :after_commit: inside an ActiveRecord transaction, the
    #   lock is kept until it commits or rolls back, so nobody reads the state before it is committed
    # @return the block's value
    def with_semaphore_lock(key, ttl: 10, namespace: "semaphore_lock", wait: false, renew: false, limit: 1,
                            release: :after_block, locker: LockManager.locker, &block)
      raise ArgumentError, "with_semaphore_lock needs a block" unless block

      key = "#{namespace}:#{Arguments.key(key)}"
      if (transaction = Lockable.release_with(release, limit))
        Lockable.until_commit(transaction, locker, key, ttl: ttl, wait: wait, renew: renew, &block)
      else
        Lockable.around_block(locker, key, ttl: ttl, wait: wait, renew: renew, limit: limit, &block)
      end
    end

    # `with_lock` where no other is defined (see Lockable). Included through a module of the app's,
    # it may still land above a class that has its own: that one is called then.
    module WithLock
      def with_lock(...)
        return super if defined?(super)

        with_semaphore_lock(...)
      end
    end

    class << self
      # The transaction whose end releases the lock, or nil: after the block.
      # @api private
      def release_with(release, limit)
        raise ArgumentError, "release must be :after_block or :after_commit, got #{release.inspect}" unless
          RELEASES.include?(release)
        return unless release == :after_commit
        raise ArgumentError, "release: :after_commit takes limit: 1 (a semaphore is released after its block)" if
          limit != 1

        open_transaction
      end

      # The transaction this thread has open on the primary database, or nil. One that is not joinable (the one
      # Rails' transactional tests run each test in, or `transaction(joinable: false)`) does not count: records'
      # after_commit callbacks run when their own transaction inside it commits, not at its end, and a lock is
      # released as they run. Asking takes no connection from the pool.
      # @api private
      def open_transaction
        return unless defined?(::ActiveRecord::Base)

        connection = ::ActiveRecord::Base.connection_pool.active_connection? or return
        transaction = connection.current_transaction
        transaction if transaction.open? && transaction.joinable?
      rescue ::ActiveRecord::ConnectionNotEstablished
        nil
      end

      # @api private
      def around_block(locker, key, ttl:, wait:, renew:, limit:, &block)
        return waiting(locker, key, wait == true ? ttl : wait, ttl: ttl, renew: renew, limit: limit, &block) if wait

        value = nil
        result = locker.nonblocking_lock(key, timeout: ttl, renew: renew, limit: limit) do |held|
          value = yield :locked, held.fencing_token
        end
        result.run? ? value : yield(:skipped, nil)
      end

      # @api private
      def waiting(locker, key, seconds, ttl:, renew:, limit:)
        ran = false
        locker.blocking_lock(key, timeout: ttl, wait: seconds, renew: renew, limit: limit) do |held|
          ran = true
          yield :locked, held.fencing_token
        end
      rescue LockNotAcquired
        raise if ran # the block's own

        yield :skipped, nil
      end

      # @api private
      def until_commit(transaction, locker, key, ttl:, wait:, renew:)
        lock = take(locker, key, ttl: ttl, wait: wait, renew: renew)
        return yield(:skipped, nil) unless lock
        return yield(:locked, nil) if lock == :unlocked

        TransactionRelease.new(lock).register(transaction)
        yield :locked, lock.fencing_token
      end

      # @return [Lock, nil, :unlocked] the lock; nil when held by another (or :skip); :unlocked when
      #   Redis could not be reached and on_redis_error says :run
      def take(locker, key, ttl:, wait:, renew:)
        return locker.try_lock(key, timeout: ttl, renew: renew) unless wait

        locker.lock(key, timeout: ttl, wait: wait == true ? ttl : wait, renew: renew)
      rescue LockNotAcquired
        nil
      rescue ConnectionError => e
        OnRedisError.decide(key, e, locker) == :run ? :unlocked : nil
      end
    end

    # Releases a lock when the ActiveRecord transaction it was taken in commits or rolls back.
    class TransactionRelease
      def initialize(lock)
        @lock = lock
      end

      def register(transaction)
        if transaction.respond_to?(:after_commit) # Rails 7.2+
          transaction.after_commit { release }
          transaction.after_rollback { release }
        else
          transaction.connection.add_transaction_record(self)
        end
      end

      # What ActiveRecord asks of a transaction record (6.1 to 7.1).
      def trigger_transactional_callbacks?
        true
      end

      def before_committed!; end

      def committed!(should_run_callbacks: true) # rubocop:disable Lint/UnusedMethodArgument
        release
      end

      def rolledback!(force_restore_state: false, should_run_callbacks: true) # rubocop:disable Lint/UnusedMethodArgument
        release
      end

      private

      # The transaction's outcome stands whatever Redis says now: a lock left behind expires by its TTL.
      def release
        lock = @lock or return
        @lock = nil
        lock.release
      rescue LockManager::Error => e
        LockManager.logger&.warn("lock_manager: #{e.message}; the lock #{lock.key.inspect} expires by its TTL")
      end
    end
  end
end
