# frozen_string_literal: true

module LockManager
  # What a nonblocking_lock call did: whether the block ran, and its value.
  class Result
    attr_reader :result

    def initialize(run, result = nil)
      @run = run
      @result = result
    end

    # @return [Boolean] true if the lock was free and the block ran
    def run?
      @run
    end

    def inspect
      "#<#{self.class} run?=#{@run} result=#{@result.inspect}>"
    end
  end
end
