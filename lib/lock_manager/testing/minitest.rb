# frozen_string_literal: true

require "minitest"
require_relative "../testing"

module LockManager
  module Testing
    # Minitest's side (included in Minitest::Test, so ActiveSupport::TestCase has them too):
    #
    #   assert_locked("user:1") { SyncUser.call(1) }
    #   refute_locked(/\Areport/) { Report.cached }
    module Assertions
      # Passes when the block (or code it called, in any thread) acquired `key`.
      # @param key [String, Symbol, Regexp] as given to the lock call, without key_prefix
      # @return the block's value
      def assert_locked(key, msg = nil, &block)
        recording, value = Recorder.record(&block)
        assert(recording.taken?(key),
               message(msg) { "Expected the block to lock #{key.inspect}, but it #{recording.summary}" })
        value
      end

      # Passes when the block did not acquire `key`.
      # @return the block's value
      def refute_locked(key, msg = nil, &block)
        recording, value = Recorder.record(&block)
        refute(recording.taken?(key),
               message(msg) { "Expected the block not to lock #{key.inspect}, but it #{recording.summary}" })
        value
      end
    end

    # Every test starts with no fake lock held.
    module MinitestReset
      def before_setup
        super
        LockManager::Testing.reset!
      end
    end
  end
end

Minitest::Test.include(LockManager::Testing::Assertions, LockManager::Testing::MinitestReset)
