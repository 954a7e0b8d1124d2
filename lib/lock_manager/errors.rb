# frozen_string_literal: true

module LockManager
  # Base class of every error the gem raises on its own.
  class Error < StandardError; end

  # The lock stayed held by someone else for the whole wait.
  class LockNotAcquired < Error
    attr_reader :key, :waited

    # @param key [String] the key as the caller gave it (without the prefix)
    # @param waited [Float, nil] seconds spent waiting
    def initialize(key = nil, waited = nil)
      @key = key
      @waited = waited
      super(if waited
              "lock #{key.inspect} is held by another owner; gave up after #{format("%.3f", waited)}s"
            else
              "lock #{key.inspect} is held by another owner"
            end)
    end
  end

  # Redis is unreachable, reset the connection, or did not answer within read_timeout.
  class ConnectionError < Error; end

  # No pooled connection became free within pool_timeout.
  class PoolTimeout < Error; end
end
