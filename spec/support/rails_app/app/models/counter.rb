# frozen_string_literal: true

# A model with both locks: the gem's with_semaphore_lock (across processes) and ActiveRecord's own
# `with_lock` (a transaction and a reload; SELECT ... FOR UPDATE where the database has it), which
# including LockManager::Lockable must leave alone.
class Counter < ApplicationRecord
  include LockManager::Lockable

  # Adds one to a copy loaded before the lock: the semaphore serializes the bumps, and with_lock
  # reloads the value the previous holder committed (its transaction ends inside the locked block).
  def bump!
    with_semaphore_lock("counter:#{id}", ttl: 10, wait: true) do |status, fencing_token|
      raise LockManager::LockNotAcquired, "counter:#{id}" unless status == :locked

      with_lock { update!(value: value + 1, fencing_token: fencing_token) }
    end
  end
end
