# frozen_string_literal: true

require "spec_helper"
require "lock_manager/testing/rspec"
require_relative "../support/limiter_examples"

# LockManager::Testing.fake!: limiters in process that decide as the Redis ones do, on a clock tests move.
RSpec.describe "Limiters under LockManager::Testing.fake!", lock_manager: :fake do
  let(:limiter_name) { "limiter:#{SecureRandom.hex(4)}" }

  before { LockManager::Testing.reset! }

  include_examples "a limiter backend"

  it "moves its clock with Testing.travel: a window passes, a rate refills" do
    exports = LockManager::Limiter.window(limiter_name, 1, per: 3600)
    api = LockManager::Limiter.new("#{limiter_name}:api", rate: 1, per: 60)
    [exports, api].each(&:try_acquire)

    LockManager::Testing.travel(3600)

    expect([exports, api].map { |limiter| limiter.try_acquire.admitted? }).to eq([true, true])
  end

  it "admits everything under Testing.disable!" do
    api = LockManager::Limiter.new(limiter_name, rate: 1, per: 60)

    LockManager::Testing.disable do
      expect(Array.new(3) { api.try_acquire.admitted? }).to eq([true, true, true])
    end
    expect(Array.new(2) { api.try_acquire.admitted? }).to eq([true, false])
  end
end
