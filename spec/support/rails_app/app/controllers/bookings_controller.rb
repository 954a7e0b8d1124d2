# frozen_string_literal: true

# "Create the booking of a slot unless it exists", under a lock, in a transaction that goes on after the locked
# block (`work` seconds: more writes, a call to another service). With release: :after_commit the lock is kept
# until the transaction commits, so the next request reads the committed booking; with :after_block the next
# request takes the lock before the commit and reads the slot as still free.
class BookingsController < ActionController::API
  include LockManager::Lockable

  # How many bookings the slot has.
  def index
    render json: { count: Booking.where(slot: params.require(:slot)).count }
  end

  # 201 when it made the booking, 200 when it found it, 409 when the wait ran out, 422 when rolled back.
  def create
    booking, created = Booking.transaction do
      booked = book(params.require(:slot))
      sleep Float(params.fetch(:work, 0))
      raise ActiveRecord::Rollback if params[:rollback]

      booked
    end
    return head(params[:rollback] ? :unprocessable_entity : :conflict) unless booking

    render json: { id: booking.id, created: created, pid: Process.pid }, status: created ? :created : :ok
  end

  private

  # @return [Array(Booking, Boolean), nil] the booking and whether this request made it; nil when skipped
  def book(slot)
    release = LockManager::Lockable::RELEASES.find { |name| name.to_s == params.fetch(:release, "after_commit") }
    wait = params.key?(:wait) ? Float(params[:wait]) : true
    with_semaphore_lock("booking:#{slot}", ttl: 10, wait: wait, release: release) do |status, fencing_token|
      next unless status == :locked

      found = Booking.find_by(slot: slot)
      [found || Booking.create!(slot: slot, fencing_token: fencing_token), found.nil?]
    end
  end
end
