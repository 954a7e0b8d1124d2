# frozen_string_literal: true

module LockManager
  module Testing
    # The plain locks each thread holds, for AlreadyHeld, as the extension keeps them: each valid
    # until its TTL, its max_hold, or (renewed without a cap) its release. The fake's Lockers share
    # one keyspace, so they share this too.
    class Registry
      # A thread's plain lock.
      Entry = Struct.new(:thread, :key, :until)

      def initialize
        @mutex = Mutex.new
        @entries = []
      end

      def clear
        @mutex.synchronize { @entries.clear }
      end

      # @return [Entry] for #held_until and #delete
      def add(key, request)
        entry = Entry.new(Thread.current, key, request.held_until(Keyspace.clock))
        @mutex.synchronize { @entries << entry }
        entry
      end

      def held_until(entry, seconds)
        @mutex.synchronize { entry.until = Keyspace.clock + seconds }
      end

      def delete(entry)
        @mutex.synchronize { @entries.delete(entry) }
      end

      # @raise [AlreadyHeld] as the extension does, for a thread asking again for a plain lock it holds
      def check_not_held(key, name)
        thread = Thread.current
        now = Keyspace.clock
        held = @mutex.synchronize { @entries.select { |entry| entry.thread == thread && entry.key == key } }
        return unless held.any? { |entry| entry.until.nil? || entry.until > now }

        raise AlreadyHeld, "lock #{Testing.quote(name)}: already held by this thread through this Locker (a plain " \
                           "lock is not re-entrant; limit: N counts each acquisition as a permit)"
      end
    end
  end
end
