# frozen_string_literal: true

module LockManager
  module Sidekiq
    # A unique job's lock claimed in the round trip that pushes the job. Where Sidekiq's Redis is
    # the locks' Redis (the same server and database), the client middleware only marks the job;
    # at the write, one script claims its lock and pushes the job only when the claim was taken:
    # a job is pushed with its lock or not at all. The commands are Sidekiq's own (its
    # atomic_push, recorded per job). Elsewhere (another Redis, a Cluster, Sidekiq::Testing, a
    # connection Sidekiq wraps such as a namespace, another module's raw_push in front of ours)
    # the lock is claimed first, then Sidekiq pushes: two round trips. So is a push_bulk's
    # (BulkPush), which is cheaper that way.
    module OnePush
      # The instance variable of a payload whose claim travels with its push: its JobLock.
      DEFERRED = :@lock_manager_deferred_claim
      # The instance variable of Sidekiq's pool that keeps whether its Redis is the locks': [locker, Boolean].
      SAME_REDIS = :@lock_manager_same_redis
      # Sidekiq's connection errors (6.4: redis-rb; 7 and 8: redis-client), by name: either may be absent.
      CLIENT_CONNECTION_ERRORS = %w[Redis::BaseConnectionError RedisClient::ConnectionError].freeze

      class << self
        # Whether a push through `redis_pool` (Sidekiq's) can carry its claim.
        def possible?(redis_pool)
          return false unless ours?

          locker = LockManager.locker
          known = redis_pool.instance_variable_get(SAME_REDIS)
          return known[1] if known && known[0].equal?(locker)

          same = same_redis?(redis_pool, locker)
          redis_pool.instance_variable_set(SAME_REDIS, [locker, same]) unless same.nil? || redis_pool.frozen?
          same || false
        end

        # Runs the rest of the middleware chain; the job it returns (what Sidekiq writes) carries
        # the claim to the write. A job stopped there was never claimed; a frozen one is claimed now.
        def deferring(lock)
          payload = yield
          return payload unless payload.is_a?(Hash)
          return claimed_now(lock, payload) if payload.frozen?

          payload.instance_variable_set(DEFERRED, lock)
          payload
        end

        # @return [Hash, nil] the payload, or nil when another job holds its lock
        def claimed_now(lock, payload)
          holder = JobLock.claim([lock], [payload["at"]]).first
          holder ? Jobs.refused(lock, payload, holder) : payload
        end

        # Claims and pushes, in one round trip, those of Sidekiq's `payloads` whose claims travel
        # with them. A refused job is left out of `payloads` and its jid is nil: Client#push returns
        # the jid.
        # @return [Array<Hash>] the payloads Sidekiq writes itself
        def write(client, payloads)
          return payloads unless payloads.any? { |payload| deferred?(payload) } # a plain push: no Array made

          deferred, others = payloads.partition { |payload| deferred?(payload) }
          deferred = Parking.write(client, deferred) # a wrapped ActiveJob parks rather than being pushed
          return others if deferred.empty?

          replies = claim(deferred, deferred.map { |payload| commands(client, payload) })
          return payloads unless replies # Redis unreachable, on_redis_error: :run: pushed without their locks

          replaced(deferred, replies)
          refuse(payloads, deferred, replies)
          others
        end

        # Sidekiq's commands for one job, as its atomic_push writes them (on a copy: it changes the job).
        def commands(client, payload)
          recorder = Recorder.new
          client.send(:atomic_push, recorder, [payload.dup])
          recorder.commands
        end

        private

        def ours?
          !testing? && ::Sidekiq::Client.instance_method(:raw_push).owner == Push
        end

        def deferred?(payload)
          payload.instance_variable_defined?(DEFERRED)
        end

        # The jobs that replaced a pending one ([fencing token, its jid]): logged.
        def replaced(deferred, replies)
          return unless replies.any?(Array)

          replies.each_with_index do |reply, index|
            job = deferred[index]
            Jobs.replaced(job.instance_variable_get(DEFERRED), job, reply.last) if reply.is_a?(Array)
          end
        end

        # The jobs whose locks others hold: logged, their jid nil, left out of `payloads`.
        def refuse(payloads, deferred, replies)
          refused = deferred.each_index.select { |index| replies[index].is_a?(String) }
          refused.each do |index|
            job = deferred[index]
            Jobs.refused(job.instance_variable_get(DEFERRED), job, replies[index])
            job["jid"] = nil
          end
          payloads.reject! { |payload| payload["jid"].nil? && deferred?(payload) } unless refused.empty?
        end

        # The replies; nil when Redis could not be asked and the jobs go without their locks.
        def claim(payloads, pushes)
          locks = payloads.map { |payload| payload.instance_variable_get(DEFERRED) }
          JobLock.claim(locks, payloads.map { |payload| payload["at"] }, pushes: pushes)
        rescue ConnectionError => e
          return if OnRedisError.decide(locks.first.key, e) == :run

          Array.new(locks.size, OnRedisError::UNREACHABLE)
        end

        def testing?
          defined?(::Sidekiq::Testing) && ::Sidekiq::Testing.enabled?
        end

        # Whether Sidekiq's connections reach the locks' Redis and database; nil when either
        # cannot be reached now (asked again at the next push).
        def same_redis?(redis_pool, locker)
          theirs = redis_pool.with { |conn| identity(conn) } or return false
          locker.server_identity == theirs
        rescue StandardError => e
          false unless unreachable?(e)
        end

        # "run_id/db" as Claims#server_identity says it, for the connections Sidekiq 6.4 (redis-rb)
        # and 7/8 (redis-client) hand out; nil for any other (a namespace would move the keys).
        def identity(conn)
          client = if defined?(::Redis) && conn.instance_of?(::Redis) then conn.client("info")
                   elsif compat_client?(conn) then conn.call("CLIENT", "INFO")
                   end
          db = client.to_s[/\bdb=(\d+)/, 1] or return
          "#{conn.info["run_id"]}/#{db}"
        end

        # A connection error of the locks' core or of either client Sidekiq may use.
        def unreachable?(error)
          error.is_a?(ConnectionError) ||
            error.class.ancestors.any? { |kind| CLIENT_CONNECTION_ERRORS.include?(kind.name) }
        end

        def compat_client?(conn)
          compat = defined?(::Sidekiq::RedisClientAdapter::CompatClient) && ::Sidekiq::RedisClientAdapter::CompatClient
          compat && conn.is_a?(compat)
        end
      end

      # Stands for Sidekiq's connection in its atomic_push: keeps the commands, sends nothing. A
      # command it does not know (another push than Sidekiq's) is a NoMethodError at the push.
      class Recorder
        attr_reader :commands

        def initialize
          @commands = []
        end

        %w[sadd lpush zadd].each do |name|
          define_method(name) do |key, *args|
            @commands << [name.upcase, key.to_s, *args.flatten.map(&:to_s)]
            0
          end
        end
      end

      # Prepended to Sidekiq::Client: jobs whose claims travel with their push are claimed and
      # pushed by the locks' core; the others Sidekiq writes. A push that fails after its jobs'
      # locks were claimed apart (Sidekiq's Redis down) releases the locks rather than leave them
      # for unique_for: each such claim travels on its payload (FailedPush).
      module Push
        private

        def raw_push(payloads)
          others = OnePush.write(self, payloads)
          others.empty? || super(others)
        rescue Exception # rubocop:disable Lint/RescueException -- a job not pushed leaves no lock
          (others || payloads).each { |payload| payload.instance_variable_get(FailedPush::CLAIMED)&.abandon }
          raise
        end
      end
    end
  end
end
