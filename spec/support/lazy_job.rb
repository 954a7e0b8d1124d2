# frozen_string_literal: true

# Required by LazyLoader (spec/support/lazy_app.rb) once the `sidekiq` process has run jobs.
require_relative "../../lib/lock_manager/worker"

# Records its run in the timeline: "working", then "done".
module LazyWork
  def work(seconds)
    job = { "class" => self.class.name, "jid" => jid, "args" => [seconds] }
    Sidekiq.redis { |redis| Timeline.record(redis, job, "working") }
    sleep seconds
    Sidekiq.redis { |redis| Timeline.record(redis, job, "done") }
  end
end

# One at a time: the others find "lazy" held and are skipped.
class LazyJob
  include LockManager::Worker
  include LazyWork
  sidekiq_options queue: "lazy"
  lock_with :nonblocking, key: "lazy"

  def perform(seconds)
    work(seconds)
  end
end

# One pending or running: a second push is refused.
class LazyUniqueJob
  include LockManager::Worker
  include LazyWork
  sidekiq_options queue: "lazy"
  lock_with :until_executed, key: "lazy-unique", unique_for: 60

  def perform(seconds)
    work(seconds)
  end
end
