# frozen_string_literal: true

module LockManager
  # What a lock call did: whether the block ran, its value, its fencing token, and whether the
  # lock was lost. A block that takes an argument receives it while it runs (result still nil).
  class Result
    attr_reader :result, :fencing_token

    def initialize(run, result = nil, lost: false, fencing_token: nil, lease: nil)
      @run = run
      @result = result
      @lost = lost
      @fencing_token = fencing_token
      @lease = lease
    end

    # @return [Boolean] true if the lock was free and the block ran
    def run?
      @run
    end

    # @return [Boolean] true if the lock expired while the block ran (it outlived `timeout`, or
    #   its renewal failed or reached max_hold): another holder may have run at the same time.
    #   While the block runs, it turns true as soon as the renewal (renew: true) finds out.
    def lost?
      @lost || @lease&.lost? || false
    end

    # Gives this Result to the block (which may ignore it) and returns the block's value. A lambda
    # that takes no argument (`&method(:work)`) refuses it before its body runs: only then is the
    # block made a Proc to look at, and called again without it. (Asking every block for its arity
    # made a Proc per lock call: 2-4% of 8 threads' lock cycles, measured.)
    # @api private
    def yield_to(&block)
      yield self
    rescue ArgumentError
      raise unless block.lambda? && block.arity.zero?

      yield
    end

    # Records how the block ended.
    # @api private
    def finish(result, lost:)
      @result = result
      @lost = lost
      @lease = nil
      self
    end

    def inspect
      "#<#{self.class} run?=#{@run} lost?=#{lost?} fencing_token=#{@fencing_token.inspect} " \
        "result=#{@result.inspect}>"
    end
  end
end
