# frozen_string_literal: true

module LockManager
  module Testing
    # The holders of every key, as Redis would keep them: expired ones are gone, a token is compared
    # as Redis compares it (a claim and the lock adopted from it are the same holder). Not
    # synchronized: the Store calls it under its mutex.
    class Keyspace
      def initialize(fencing)
        @fencing = fencing
        @holds = Hash.new { |hash, key| hash[key] = [] }
      end

      def clear
        @holds.clear
      end

      # The key's holders that have not expired (the expired ones are dropped).
      def live(key, now = Keyspace.clock)
        return [] unless @holds.key?(key)

        holds = @holds[key]
        holds.select! { |hold| hold.live?(now) }
        @holds.delete(key) if holds.empty?
        holds
      end

      def find(key, token)
        live(key).find { |hold| hold.token == token }
      end

      # A new holder of `key`, with the next fencing token.
      def grant(key, token, request)
        add(key, Hold.new(token, @fencing.next, request.limit, request.expires_at(Keyspace.clock), request.renewed?))
      end

      # @return [Integer, String] the fencing token when `token` holds the key now (taken, or held
      #   already: taken again, with the new expiry), else the holder's token. A renewed request
      #   (Locker#adopt) is renewed from now on.
      def claim(key, token, request)
        holds = live(key)
        other = holds.find { |hold| hold.token != token }
        return other.token if other

        expires_at = request.expires_at(Keyspace.clock)
        mine = holds.first || add(key, Hold.new(token, nil, 1, expires_at, false))
        extend_to(mine, expires_at)
        mine.leased ||= request.renewed?
        mine.fencing_token = @fencing.next
      end

      def add(key, hold)
        @holds[key] << hold
        hold
      end

      # A hold's new expiry; never earlier, while renewed.
      def extend_to(hold, expires_at)
        hold.expires_at = hold.leased ? [hold.expires_at, expires_at].max : expires_at
      end

      def delete(key, hold)
        holds = live(key)
        holds.delete(hold)
        @holds.delete(key) if holds.empty?
      end

      # When the first holder of `key` expires (infinity when none will).
      def next_expiry(key)
        live(key).map(&:expires_at).min || Float::INFINITY
      end

      def self.clock
        Process.clock_gettime(Process::CLOCK_MONOTONIC)
      end
    end
  end
end
