# frozen_string_literal: true

require_relative "../lock_manager"

module LockManager
  # For controllers and services: the seed's Rails helper, on the gem's own pool (not
  # Rails.cache), releasing only its own lock.
  #
  #   include LockManager::Lockable
  #   with_lock("lesson_session:#{uuid}", ttl: 10) do |status|
  #     status == :locked ? create_the_record : head(:no_content)
  #   end
  module Lockable
    # Yields :locked while holding the lock, or :skipped when someone else holds it.
    # @return the block's value
    def with_lock(key, ttl: 10, namespace: "semaphore_lock")
      raise ArgumentError, "with_lock needs a block" unless block_given?

      value = nil
      result = LockManager::Locker.nonblocking_lock("#{namespace}:#{key}", timeout: ttl) { value = yield :locked }
      result.run? ? value : yield(:skipped)
    end
  end
end
