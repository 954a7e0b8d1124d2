# frozen_string_literal: true

module LockManager
  module Testing
    # What one lock call asks for, as the extension receives it: TTL in ms, wait in seconds (nil:
    # one attempt), limit, fair, and renewal (false, true, or its cap in ms).
    Request = Struct.new(:ttl_ms, :wait, :limit, :fair, :renewal) do
      def ttl
        ttl_ms / 1000.0
      end

      def shared?
        limit > 1
      end

      def renewed?
        renewal != false
      end

      # When a lock taken `now` expires: after its TTL, or as renewal keeps it: never, or at its
      # cap (max_hold), unless the cap passes before the first renewal (a third of the TTL) runs.
      def expires_at(now)
        case renewal
        when false then now + ttl
        when true then Float::INFINITY
        else
          cap = renewal / 1000.0
          now + (cap > ttl / 3 ? cap : ttl)
        end
      end

      # Until when the taking thread counts the lock as its own (see Registry).
      def held_until(now)
        case renewal
        when false then now + ttl
        when true then nil
        else now + (renewal / 1000.0)
        end
      end
    end

    # One holder of a key: its token, fencing token, expiry (monotonic seconds), and whether a
    # renewal keeps it (then a claim or refresh never shortens it: renewal would extend it again).
    Hold = Struct.new(:token, :fencing_token, :limit, :expires_at, :leased) do
      def live?(now)
        expires_at > now
      end
    end
  end
end
