# frozen_string_literal: true

# The two Sidekiq job classes the job benches push (bench/jobs.rb, bench/instructions_worker.rb), on
# JOB_QUEUE. Load Sidekiq and lock_manager/worker first: the instructions worker loads the
# lock_manager of the lib/ it measures.

JOB_QUEUE = "bench"

# The baseline: no lock_with (the gem's client middleware still sees it, and lets it through).
class PlainJob
  include Sidekiq::Worker
  sidekiq_options queue: JOB_QUEUE

  def perform(*); end
end

# Unique until it has run: its lock is claimed at push, held by the job's jid.
class UniqueJob
  include LockManager::Worker
  sidekiq_options queue: JOB_QUEUE
  lock_with :until_executed, unique_for: 3600

  def perform(*); end
end
