# frozen_string_literal: true

module LockManager
  module Sidekiq
    # push_bulk takes every unique job's lock before the jobs go through the client middleware, in
    # one round trip per 1,000 jobs; the middleware then keeps or drops each job (a kept job's jid
    # becomes the one its lock was claimed for). Its claims never travel with the push (OnePush):
    # Sidekiq's one LPUSH of the whole batch costs Redis half the CPU of a script that reads every
    # job's payload to push it (bench/README.md). Each job's claim travels with it, on its own
    # copy of its arguments: the one thing of the bulk's that Sidekiq hands the middleware per job.
    class BulkPush
      SLICE = 1_000
      # The instance variable of a job's arguments that holds its claim: [bulk, index].
      CLAIM = :@lock_manager_bulk_claim
      # Sidekiq 8 spreads a bulk's jobs over `spread_interval` seconds, and never less than this.
      MIN_SPREAD = 5

      # Prepended to Sidekiq::Client.
      module Client
        def push_bulk(items)
          bulk = BulkPush.prepare(items)
          bulk ? BulkPush.around(bulk) { super(bulk.items) } : super
        end
      end

      class << self
        # The claim a bulk took for `job` and whoever holds its lock: [JobLock, holder or nil]; nil for a job
        # of no bulk (or whose arguments another middleware replaced).
        def take(job)
          bulk, index = job["args"].instance_variable_get(CLAIM)
          bulk&.take(index, job)
        end

        # The bulk's claims, or nil when its class has no unique lock.
        def prepare(items)
          return unless items["args"].is_a?(Array)

          klass, options = Jobs.unique_options(items, items["class"])
          new(items, klass, options) if klass && options
        end

        def around(bulk)
          pushed = yield
          bulk.release_unpushed
          pushed
        rescue Exception # rubocop:disable Lint/RescueException -- jobs not pushed leave no lock
          bulk.release_unpushed(all: true)
          raise
        end
      end

      # What push_bulk pushes: the items, each job's arguments a copy that carries its claim (the same
      # Array may be listed twice, `args * 2`: each of the two jobs gets its own).
      attr_reader :items

      def initialize(items, klass, options)
        @locks = items["args"].map { |job_args| lock_for(items, klass, options, job_args) }
        @holders = claim(scheduled_at(items))
        @taken = []
        @items = items.merge("args" => items["args"].each_with_index.map { |args, index| carrying(args, index) })
      end

      # @return [Array(JobLock, String)] the lock of the job at `index` and, when another holds it, the holder
      def take(index, job)
        job["jid"] = @locks[index].token unless job["wrapped"]
        @taken[index] = true
        [@locks[index], @holders[index]]
      end

      # Releases the claims of jobs not pushed: another middleware stopped them, or the push failed.
      def release_unpushed(all: false)
        @locks.each_with_index do |lock, index|
          lock.abandon unless @holders[index] || (@taken[index] && !all)
        end
      end

      private

      # A copy of a job's arguments that carries its claim (Sidekiq refuses what is no Array anyway).
      def carrying(job_args, index)
        return job_args unless job_args.is_a?(Array)

        job_args.dup.tap { |copy| copy.instance_variable_set(CLAIM, [self, index]) }
      end

      def claim(scheduled)
        @locks.each_slice(SLICE).zip(scheduled.each_slice(SLICE)).flat_map { |locks, ats| JobLock.claim(locks, ats) }
      end

      # Each job's scheduled time: "at", one for all or one per job (Sidekiq 8 also takes :at).
      def scheduled_at(items)
        at = items["at"] || items[:at] || latest_spread(items)
        @locks.each_index.map { |index| at.is_a?(Array) ? at[index] : at }
      end

      # With Sidekiq 8's spread_interval, the latest time it may pick for a job.
      def latest_spread(items)
        spread = items["spread_interval"] || items[:spread_interval]
        Time.now.to_f + [spread, MIN_SPREAD].max if spread.is_a?(Numeric) && spread.positive?
      end

      # A wrapped ActiveJob is held by its job_id; a Sidekiq job by the jid it is about to get.
      def lock_for(items, klass, options, job_args)
        job = { "class" => items["class"], "wrapped" => items["wrapped"], "args" => job_args,
                "jid" => SecureRandom.hex(12) }
        Jobs.build(job, klass, options)
      end
    end
  end
end
