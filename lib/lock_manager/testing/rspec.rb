# frozen_string_literal: true

require "rspec/core"
require "rspec/expectations"
require_relative "../testing"

module LockManager
  module Testing
    # `expect { ... }.to lock("user:1")`: the block (or code it called, in any thread) acquired the key.
    class LockMatcher
      # @param key [String, Symbol, Regexp]
      def initialize(key)
        @key = key
      end

      def matches?(block)
        unless block.respond_to?(:call)
          raise ArgumentError, "lock(#{@key.inspect}) needs a block: expect { ... }.to lock(#{@key.inspect})"
        end

        @recording, = Recorder.record(&block)
        @recording.taken?(@key)
      end

      def does_not_match?(block)
        !matches?(block)
      end

      def supports_block_expectations?
        true
      end

      # `expect(value).to lock(...)` cannot see any lock being taken.
      def supports_value_expectations?
        false
      end

      def failure_message
        "expected the block to lock #{@key.inspect}, but it #{@recording.summary}"
      end

      def failure_message_when_negated
        "expected the block not to lock #{@key.inspect}, but it #{@recording.summary}"
      end

      def description
        "lock #{@key.inspect}"
      end
    end

    # RSpec's side: the `lock` matcher, a fresh fake keyspace per example, and `lock_manager:`
    # metadata (:fake, :disabled or :real) to run one example or group in that mode.
    module Matchers
      # @param key [String, Symbol, Regexp] the key (as given to the lock call, without key_prefix)
      def lock(key)
        LockMatcher.new(key)
      end
    end
  end
end

RSpec.configure do |config|
  config.include LockManager::Testing::Matchers
  config.before { LockManager::Testing.reset! }
  config.around(:example, :lock_manager) do |example|
    mode = example.metadata[:lock_manager]
    unless %i[fake disabled real].include?(mode)
      raise ArgumentError, "lock_manager: metadata must be :fake, :disabled or :real, got #{mode.inspect}"
    end

    LockManager::Testing.public_send(mode == :disabled ? :disable : mode) { example.run }
  end
end
