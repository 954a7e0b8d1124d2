# frozen_string_literal: true

# The README's controller example, as it is there: test/readme_booking_test.rb runs it in Rails' own
# integration tests (one transaction per test, never committed).
class ReadmeBookingsController < ActionController::API
  include LockManager::Lockable

  def create
    with_semaphore_lock("booking:#{params[:slot]}", ttl: 10, wait: 2, release: :after_commit) do |status|
      next head(:conflict) if status == :skipped # held by another request for the 2 s

      Booking.transaction { Booking.find_or_create_by!(slot: params[:slot]) }
    end
  end
end
