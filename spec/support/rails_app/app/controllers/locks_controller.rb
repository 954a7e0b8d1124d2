# frozen_string_literal: true

# Locks taken by requests. Errors are not rescued here: the Railtie's rescue_responses turn
# LockManager::LockNotAcquired into 409 and an unreachable Redis into 503.
class LocksController < ActionController::API
  include LockManager::Lockable

  # Waits up to `wait` seconds for the lock (blocking_lock), holds it `hold` seconds.
  def wait
    wait = Float(params.require(:wait))
    token = LockManager::Locker.blocking_lock(params.require(:key), timeout: 10, wait: wait) do |lock|
      sleep Float(params.fetch(:hold, 0))
      lock.fencing_token
    end
    render json: { fencing_token: token, pid: Process.pid }
  end

  # One attempt (with_semaphore_lock): 200 when the block ran locked, the "taken" path (409, "skipped") otherwise.
  def try
    with_semaphore_lock(params.require(:key), ttl: Float(params.fetch(:ttl, 10))) do |status, fencing_token|
      sleep Float(params.fetch(:hold, 0)) if status == :locked
      render json: { status: status, fencing_token: fencing_token, pid: Process.pid },
             status: status == :locked ? :ok : :conflict
    end
  end
end
