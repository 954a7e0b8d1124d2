# frozen_string_literal: true

# The app's own tests, as `rails test` runs them (spec/rails runs this file in a child process): Rails'
# transactional tests, where each test runs in a transaction that is never committed. LOCKS=fake runs them on
# LockManager::Testing's in-process locks, otherwise on the app's Redis.
require_relative "../config/environment"
require "rails/test_help"
require "lock_manager/testing/minitest"

LockManager::Testing.fake! if ENV["LOCKS"] == "fake"

# The README's controller example (app/controllers/readme_bookings_controller.rb).
class ReadmeBookingTest < ActionDispatch::IntegrationTest
  test "books a slot twice in one test: the lock of the first request is not kept for the test's transaction" do
    2.times do
      assert_locked("semaphore_lock:booking:s1") { post "/readme/bookings", params: { slot: "s1" } }
      assert_response :no_content
    end
    assert_equal 1, Booking.where(slot: "s1").count
  end
end

class AfterCommitTest < ActiveSupport::TestCase
  include LockManager::Lockable

  def held?(key)
    LockManager.locker.locked?("semaphore_lock:#{key}")
  end

  def lock(key)
    with_semaphore_lock(key, release: :after_commit) { |status| status }
  end

  test "outside a transaction of its own, releases after the block, as a record's after_commit runs at once" do
    assert_equal :locked, lock("k")
    refute held?("k")
    assert_equal :locked, lock("k")
  end

  test "inside a transaction, holds the lock until it commits" do
    Booking.transaction do
      assert_equal :locked, lock("k")
      Booking.create!(slot: "k")
      assert held?("k")
    end
    refute held?("k")
  end

  test "inside a transaction, holds the lock until it rolls back" do
    Booking.transaction do
      assert_equal :locked, lock("k")
      assert held?("k")
      raise ActiveRecord::Rollback
    end
    refute held?("k")
  end

  test "inside nested transactions, holds the lock until the outer one commits" do
    Booking.transaction do
      Booking.transaction(requires_new: true) { assert_equal :locked, lock("k") }
      assert held?("k")
    end
    refute held?("k")
  end
end
