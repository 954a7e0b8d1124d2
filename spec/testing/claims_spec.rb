# frozen_string_literal: true

require "spec_helper"
require "lock_manager/testing/rspec"
require_relative "../support/lock_backend_examples"

# Claims under LockManager::Testing.fake!: the examples Redis's claims pass too (spec/lock_manager/backends_spec.rb).
RSpec.describe "LockManager::Testing.fake! claims", lock_manager: :fake do
  let(:locker) { LockManager::Locker.new }

  include FakeQueuedWaiters

  include_examples "claims of a lock backend"
end
