# frozen_string_literal: true

require "json"

# What jobs did, as they recorded it in Redis: a list of JSON events. Shared by the jobs that
# write it (demo/jobs.rb), bin/demo and the end-to-end specs that read it.
module Timeline
  KEY = ENV.fetch("TIMELINE_KEY", "lock_manager:timeline")

  module_function

  # @param redis [#call] where to write: a redis-rb Redis, or what Sidekiq.redis yields (redis-rb on
  #   Sidekiq 6, redis-client on 7); both take a command as #call's arguments
  def record(redis, job, event)
    entry = { "at" => Time.now.to_f, "class" => job["class"], "jid" => job["jid"], "args" => job["args"],
              "event" => event }
    redis.call("RPUSH", KEY, JSON.generate(entry))
  end

  # @param redis [#call] as for record
  # @return [Array<Hash>] every event, oldest first
  def read(redis, key = KEY)
    redis.call("LRANGE", key, 0, -1).map { |line| JSON.parse(line) }
  end

  # [start, finish] of each job's work: from its "working" event to the first event matching `finished`.
  def work_intervals(events, finished)
    events.group_by { |e| e["jid"] }.values.filter_map do |list|
      working = list.find { |e| e["event"] == "working" }
      done = list.find { |e| e["event"].match?(finished) }
      [working["at"], done["at"]] if working && done
    end
  end

  # The largest number of intervals that overlap at any moment.
  def most_at_once(intervals)
    steps = intervals.flat_map { |from, to| [[from, 1], [to, -1]] }.sort
    steps.reduce([0, 0]) { |(now, most), (_, step)| [now + step, [most, now + step].max] }.last
  end
end
