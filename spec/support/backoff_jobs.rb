# frozen_string_literal: true

# Jobs with on_conflict: :reschedule's backoff, for spec/sidekiq/backoff_spec.rb. Loaded by `sidekiq -r`,
# and by the spec, whose pushes go through the client middleware as a web process's would. Each job keys
# its lock on its first argument (the example's run), records its runs in the list "ran" of LOCK_PREFIX,
# and every push for later of these jobs this process makes (the middleware's reschedules) goes to the
# list "pushes": [class, jid, args, at, the count it carries, when it was pushed].
require "json"
require "sidekiq"
require "lock_manager"
require "lock_manager/worker"

# redis-rb 4.8 warns about calls Sidekiq 6.4 makes (see demo/jobs.rb).
Redis.silence_deprecations = true if defined?(Redis) && Redis.respond_to?(:silence_deprecations=)

if ENV["LOCK_PREFIX"]
  LockManager.configure do |config|
    config.redis_url = ENV.fetch("REDIS_URL")
    config.key_prefix = ENV.fetch("LOCK_PREFIX")
  end
end

require_relative "fast_poll" # scheduled jobs come back within about a second

# Where the jobs and the push recorder write.
module BackoffRecord
  module_function

  def add(list, entry)
    Sidekiq.redis { |redis| redis.rpush("#{ENV.fetch("LOCK_PREFIX")}#{list}", JSON.generate(entry)) }
  end
end

# Records each push of a Backoff job for later made in this process, at the moment it is pushed (not the
# scheduled poller's, which pushes a due job to its queue through the client middleware too).
class BackoffPushRecorder
  def call(_job_class, job, _queue, _redis_pool)
    if job["class"].to_s.start_with?("Backoff") && job["at"]
      BackoffRecord.add("pushes", [job["class"].to_s, job["jid"], job["args"], job["at"],
                                   job[LockManager::JobBackoff::COUNT], Time.now.to_f])
    end
    yield
  end
end

Sidekiq.configure_server { |config| config.client_middleware { |chain| chain.add(BackoffPushRecorder) } }

# Records its run.
module BackoffRun
  def perform(run)
    BackoffRecord.add("ran", [self.class.name, run, jid])
  end
end

# The default backoff (1, 2, 4 ... seconds plus up to 25%), 3 reschedules at most, then skipped.
class BackoffCurveJob
  include LockManager::Worker
  include BackoffRun
  lock_with :nonblocking, key: ->(run) { "backoff:#{run}" }, on_conflict: :reschedule, max_reschedules: 3
end

# A Proc of the attempt (each one it is asked for recorded in "attempts"), 3 at most, then LockNotAcquired
# into Sidekiq's retries: an hour away, so the spec moves a retry along itself.
class BackoffProcJob
  include LockManager::Worker
  include BackoffRun
  sidekiq_options retry: 5
  sidekiq_retry_in { 3600 }
  lock_with :nonblocking, key: ->(run) { "backoff:#{run}" }, on_conflict: :reschedule, max_reschedules: 3,
                          when_exhausted: :raise,
                          reschedule_in: lambda { |attempt|
                            BackoffRecord.add("attempts", attempt)
                            0.5 * attempt
                          }
end

# Fails in its own code when it runs; its retry is an hour away (the spec moves it along).
class BackoffFailingJob
  include LockManager::Worker
  sidekiq_options retry: 5
  sidekiq_retry_in { 3600 }
  lock_with :nonblocking, key: ->(run) { "backoff:#{run}" }, on_conflict: :reschedule, reschedule_in: 0.5

  def perform(run)
    BackoffRecord.add("ran", [self.class.name, run, jid])
    raise "failed in its own code"
  end
end
