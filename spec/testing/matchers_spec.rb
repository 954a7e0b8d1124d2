# frozen_string_literal: true

require "spec_helper"
require "lock_manager/testing/rspec"
require "lock_manager/testing/minitest"

# The helpers that assert code took a key: RSpec's `lock` matcher and Minitest's assert_locked /
# refute_locked. They listen to the acquire events, so they work in every mode, Redis included.
RSpec.describe "Asserting that code took a lock" do
  # What a test case of the app's looks like to Minitest's assertions.
  let(:minitest) do
    Class.new do
      include Minitest::Assertions
      include LockManager::Testing::Assertions
      attr_accessor :assertions

      def initialize
        self.assertions = 0
      end
    end.new
  end

  def sync_user(id)
    LockManager::Locker.nonblocking_lock("user:#{id}") { :synced }
  end

  shared_examples "the helpers" do
    it "lock passes when the block took the key, and not_to lock when it did not" do
      expect { sync_user(1) }.to lock("user:1")
      expect { sync_user(1) }.to lock(:"user:1")
      expect { sync_user(1) }.to lock(/\Auser:\d+\z/)
      expect { sync_user(2) }.not_to lock("user:1")
      expect { nil }.not_to lock("user:1")
    end

    it "lock fails naming the key expected and the keys taken" do
      several = lambda do
        sync_user(2)
        sync_user(3)
        sync_user(2)
      end
      expect { expect(&several).to lock("user:1") }
        .to raise_error(RSpec::Expectations::ExpectationNotMetError,
                        'expected the block to lock "user:1", but it took "user:2" and "user:3"')
      expect { expect { nil }.to lock("user:1") }
        .to raise_error(RSpec::Expectations::ExpectationNotMetError,
                        'expected the block to lock "user:1", but it took no lock')
      expect { expect { sync_user(1) }.not_to lock("user:1") }
        .to raise_error(RSpec::Expectations::ExpectationNotMetError,
                        'expected the block not to lock "user:1", but it took "user:1"')
    end

    it "sees locks taken by threads the block starts, and lock handles" do
      expect { Thread.new { sync_user(4) }.join }.to lock("user:4")
      expect { LockManager.locker.try_lock("handle")&.release }.to lock("handle")
    end

    it "assert_locked and refute_locked pass, return the block's value, and count as assertions" do
      value = minitest.assert_locked("user:1") { sync_user(1).result }
      refuted = minitest.refute_locked("user:1") { sync_user(2).result }

      expect([value, refuted]).to eq(%i[synced synced])
      expect(minitest.assertions).to eq(2)
    end

    it "assert_locked and refute_locked fail naming the key expected and the keys taken" do
      expect { minitest.assert_locked("user:1") { sync_user(2) } }
        .to raise_error(Minitest::Assertion, 'Expected the block to lock "user:1", but it took "user:2".')
      expect { minitest.refute_locked(/user/, "syncs nobody") { sync_user(5) } }
        .to raise_error(Minitest::Assertion, "syncs nobody.\nExpected the block not to lock /user/, but it took " \
                                             '"user:5".')
    end
  end

  context "with LockManager::Testing.fake!", lock_manager: :fake do
    include_examples "the helpers"

    it "reports a key asked for and not acquired" do
      holder = Thread.new { LockManager::Locker.new.try_lock("user:1", timeout: 30) }.value

      expect { expect { sync_user(1) }.to lock("user:1") }
        .to raise_error(RSpec::Expectations::ExpectationNotMetError,
                        'expected the block to lock "user:1", but it took no lock; asked for "user:1" but did ' \
                        "not get it")
      holder.release
    end
  end

  context "with LockManager::Testing.disable!", lock_manager: :disabled do
    include_examples "the helpers"
  end

  context "on Redis", lock_manager: :real do
    before { configure_shared_locker! }

    include_examples "the helpers"
  end

  it "refuses a value expectation" do
    expect(lock("user:1").supports_value_expectations?).to be(false)
    expect { lock("user:1").matches?(1) }
      .to raise_error(ArgumentError, 'lock("user:1") needs a block: expect { ... }.to lock("user:1")')
  end

  it "refuses unknown lock_manager: metadata" do
    group = RSpec.describe("misconfigured", lock_manager: :mock) { it("runs") {} }
    group.run(RSpec::Core::NullReporter)

    expect(group.examples.first.execution_result.exception.message).to include("must be :fake, :disabled or :real")
  ensure
    RSpec.world.example_groups.delete(group)
  end
end
