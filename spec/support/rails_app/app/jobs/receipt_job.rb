# frozen_string_literal: true

# A unique job pushed when the transaction it is enqueued in commits (spec/rails/active_job_spec.rb).
class ReceiptJob < ActiveJob::Base
  include LockManager::Worker
  lock_with :until_executed, key: ->(order_id) { "receipt:#{order_id}" }, unique_for: 60
  # Rails 7.2: :always (its `true` asks the adapter, and the test adapter says no); 8.x: true.
  self.enqueue_after_transaction_commit = Rails::VERSION::MAJOR >= 8 ? true : :always if
    respond_to?(:enqueue_after_transaction_commit=)

  def perform(order_id); end
end
