# frozen_string_literal: true

require "digest"
require "json"
require_relative "clearable_jobs"

# What the specs of jobs removed through Sidekiq's API and Web UI share, in a group that includes "a
# Sidekiq client of its own" and gives `prefix` (the locks' key_prefix).
module ClearableJobHelpers
  # The default key of an until_* job: its class and a digest of its arguments as JSON.
  def key_of(klass, *args)
    "#{klass.name}:#{Digest::SHA256.hexdigest(JSON.generate(args))[0, 32]}"
  end

  def holder(key)
    admin.get("#{prefix}#{key}")
  end

  # Pushed to a queue no process reads: the jid, or nil when refused.
  def park(klass, *args)
    klass.set(queue: "parked").perform_async(*args)
  end

  # A pushed job moved into the retry or dead set (its class: Sidekiq 6.4's reads its size when made,
  # through the API's pool) as Sidekiq's JobRetry writes it, its lock still held by its jid (a failed
  # :until_executed job keeps it for its retry).
  def move_to(set_class, klass, *args)
    jid = park(klass, *args)
    job = JSON.parse(admin.rpop("queue:parked"))
    job.merge!("retry_count" => 0, "failed_at" => Time.now.to_f, "error_class" => "RuntimeError",
               "error_message" => "failed")
    through_api_pool { set_class.new.schedule(Time.now.to_f + 3600, job) }
    jid
  end
end
