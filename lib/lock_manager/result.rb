# frozen_string_literal: true

module LockManager
  # What a nonblocking_lock call did: whether the block ran, and its value.
  class Result
    attr_reader :result

    def initialize(run, result = nil, lost: false)
      @run = run
      @result = result
      @lost = lost
    end

    # @return [Boolean] true if the lock was free and the block ran
    def run?
      @run
    end

    # @return [Boolean] true if the lock expired while the block ran (it outlived `timeout`):
    #   another holder may have run at the same time
    def lost?
      @lost
    end

    def inspect
      "#<#{self.class} run?=#{@run} lost?=#{@lost} result=#{@result.inspect}>"
    end
  end
end
