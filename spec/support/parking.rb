# frozen_string_literal: true

require "json"

# Jobs parked through the real park path (Locker#park, as the Sidekiq middleware parks a job with
# on_conflict: :park) without a Sidekiq: for the specs of Admin, the command and its tasks. Their push is
# Sidekiq's shape (SADD queues, LPUSH queue:<queue> <payload>) into `parked_queue`, their fallback goes
# into `parked_schedule`: keys of the example's own, beside its key prefix.
module Parking
  def parked_queue
    @parked_queue ||= "parked_#{SecureRandom.hex(4)}"
  end

  def parked_schedule
    "#{prefix}schedule"
  end

  # A Sidekiq job's payload, as its client writes it.
  def sidekiq_job(jid, klass: "ReportJob", args: [jid, 1])
    { "class" => klass, "args" => args, "queue" => parked_queue, "jid" => jid, "retry" => true,
      "created_at" => 1_760_000_000.5, "enqueued_at" => 1_760_000_001.25 }
  end

  # Sidekiq's commands for `payload`, as its atomic_push writes them.
  def sidekiq_push(payload)
    [["SADD", "queues", parked_queue], ["LPUSH", "queue:#{parked_queue}", JSON.generate(payload)]]
  end

  # Parks the job `jid` on `key` (another token holds it; every permit of a semaphore with `limit` > 1)
  # for a lock of 30 s once handed over.
  # @return [Array(Symbol, Integer)] Locker#park's reply
  def park_job(key, jid, payload: sidekiq_job(jid), push: sidekiq_push(payload), with: elsewhere, limit: 1)
    with.park(key, jid, ttl: 30, grace: 1, most: nil, limit: limit, schedule: parked_schedule,
                        fallback: JSON.generate("class" => "Unpark", "args" => [key]), push: push)
  end

  # `key` claimed by the job `jid` for `seconds`, as a running job's lock is.
  def hold_for_job(key, jid = "holder-#{key}", seconds: 60)
    elsewhere.claim([key], [jid], [seconds]).first.is_a?(Integer) or raise "#{key} is held already"
    jid
  end

  # The jids in `parked_queue`, the last pushed first (Sidekiq takes from the right).
  def pushed_jids(client = redis)
    client.lrange("queue:#{parked_queue}", 0, -1).map { |payload| JSON.parse(payload)["jid"] }
  end
end
