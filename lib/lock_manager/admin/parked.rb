# frozen_string_literal: true

require "json"

module LockManager
  # The parked jobs' part of LockManager::Admin (admin.rb): the Sidekiq jobs with on_conflict: :park
  # that wait in Redis for a lock (docs/jobs.md), listed in their order and deleted one by one. The
  # release that hands a lock to the first of them is #release's.
  class Admin
    # A job parked on a lock: its place in line (1: the next to get the lock), its jid, job_class (a
    # wrapped ActiveJob's own class), args (an ActiveJob's serialized arguments), queue and
    # enqueued_at (when it parked; nil when its payload has none).
    ParkedJob = Struct.new(:place, :jid, :job_class, :args, :queue, :enqueued_at, keyword_init: true)

    DEFAULT_PARKED_LIMIT = 100

    # The jobs parked on `key`, first in line first (one LRANGE).
    # @param limit [Integer] the first `limit` in line
    # @return [Array<ParkedJob>] empty when none is parked
    def parked(key, limit: DEFAULT_PARKED_LIMIT)
      entries = native.parked_entries(Arguments.key(key), Arguments.positive_integer(limit, :limit))
      entries.each.with_index(1).map { |entry, place| parked_job(entry, place) }
    end

    # Takes the job `jid` out of `key`'s line: it will not run, and is not logged anywhere. The lock
    # and its holder are untouched; the jobs behind it move up.
    # @return [Boolean] whether it was parked there
    def delete_parked(key, jid)
      native.delete_parked(Arguments.key(key), Arguments.key(jid, :jid))
    end

    private

    # An entry of the line (a JSON array, ext/lock_manager/src/lua/shared/park.lua): the job's token
    # (its jid) first, its push (Sidekiq's commands) sixth, the job's payload the LPUSH's argument.
    # Bytes that are not UTF-8 (Redis keeps what it is given) read as U+FFFD.
    def parked_job(entry, place)
      entry = JSON.parse(entry.dup.force_encoding(Encoding::UTF_8).scrub)
      jid = entry[0]
      payload = job_payload(entry[5])
      ParkedJob.new(place: place, jid: jid, job_class: payload["wrapped"] || payload["class"],
                    args: job_args(payload), queue: payload["queue"], enqueued_at: enqueued_at(payload["enqueued_at"]))
    end

    def job_payload(push)
      lpush = Array(push).find { |command| command.is_a?(Array) && command.first == "LPUSH" }
      payload = lpush && JSON.parse(lpush.last.to_s)
      payload.is_a?(Hash) ? payload : {}
    rescue JSON::ParserError
      {}
    end

    # A wrapped ActiveJob's own arguments, as Sidekiq's Web shows them.
    def job_args(payload)
      args = payload["args"]
      wrapper = args.first if payload["wrapped"] && args.is_a?(Array)
      wrapper.is_a?(Hash) && wrapper.key?("arguments") ? wrapper["arguments"] : args
    end

    # Sidekiq 8 writes milliseconds (an Integer), 6 and 7 seconds (a Float).
    def enqueued_at(stamp)
      case stamp
      when Integer then Time.at(stamp / 1000, stamp % 1000, :millisecond)
      when Float then Time.at(stamp)
      end
    end
  end
end
