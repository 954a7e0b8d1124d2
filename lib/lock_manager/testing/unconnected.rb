# frozen_string_literal: true

module LockManager
  module Testing
    # What the testing backends answer for the connection they do not have.
    module Unconnected
      # Nothing is pooled.
      def pool_state
        [0, 0]
      end

      # Never connected: nil, so a Locker still checks the policy of its Redis once it goes back to it.
      def maxmemory_policy
        nil
      end
    end
  end
end
