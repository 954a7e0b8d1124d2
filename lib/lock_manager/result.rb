# frozen_string_literal: true

module LockManager
  # What a lock call did: whether the block ran, its value, its fencing token, and whether the
  # lock was lost. A block that takes an argument receives it while it runs (result still nil).
  class Result
    attr_reader :result, :fencing_token

    # (Positional: one is made per lock cycle, and keyword arguments cost more.)
    # @param lock [Native::Lock, nil] the lock while its block runs, when it is renewed
    def initialize(run, fencing_token = nil, lock = nil)
      @run = run
      @result = nil
      @lost = false
      @fencing_token = fencing_token
      @lock = lock
    end

    # @return [Boolean] true if the lock was free and the block ran
    def run?
      @run
    end

    # @return [Boolean] true if the lock expired while the block ran (it outlived `timeout`, or
    #   its renewal failed or reached max_hold): another holder may have run at the same time.
    #   While the block runs, it turns true as soon as the renewal (renew: true) finds out.
    def lost?
      @lost || @lock&.lost? || false
    end

    # Gives this Result to the block (which may ignore it), and keeps and returns the block's
    # value. A lambda that takes no argument (`&method(:work)`) refuses it before its body runs:
    # only then is the block made a Proc to look at, and called again without it. (Asking every
    # block for its arity made a Proc per lock call: 2-4% of 8 threads' lock cycles, measured.)
    # @api private
    def yield_to(&block)
      @started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      @result = begin
        yield self
      rescue ArgumentError
        raise unless block.lambda? && block.arity.zero?

        yield
      end
    end

    # @return [Float] seconds since the block started
    # @api private
    def ran_for
      Process.clock_gettime(Process::CLOCK_MONOTONIC) - @started
    end

    # Records whether the lock was held to the end of the block.
    # @api private
    def finish(lost)
      @lost = lost
      @lock = nil
      self
    end

    def inspect
      "#<#{self.class} run?=#{@run} lost?=#{lost?} fencing_token=#{@fencing_token.inspect} " \
        "result=#{@result.inspect}>"
    end
  end
end
