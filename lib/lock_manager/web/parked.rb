# frozen_string_literal: true

require "cgi"
require "json"

module LockManager
  # The parked jobs' part of the Locks tab (web.rb): a lock's page lists the jobs parked on it (on_conflict:
  # :park), each with a delete button behind Sidekiq's CSRF protection; its release button hands the lock to
  # the first of them.
  module Web
    # A lock's page shows the first this many of its parked jobs.
    PARKED_LIMIT = 100
    # A parked job's arguments are shown up to this many characters.
    ARGS_LIMIT = 1000

    # The parked jobs' view helpers (beside web.rb's).
    module Helpers
      # The first PARKED_LIMIT jobs parked on the lock of the page.
      def lock_manager_parked
        LockManager::Web.admin.parked(@lock_key, limit: PARKED_LIMIT)
      end

      # Deletes the job `jid` parked on `key` (both in the query string), then shows the lock's page, saying
      # what it did.
      def lock_manager_delete_parked
        key = lock_manager_param("key") || redirect("#{root_path}locks")
        jid = lock_manager_param("jid") || redirect(lock_manager_path(key))
        deleted = LockManager::Web.admin.delete_parked(key, jid)
        redirect("#{lock_manager_path(key)}&deleted=#{deleted ? 1 : 0}&jid=#{CGI.escape(jid)}")
      end

      # Where a parked job's delete form posts: its lock's key and its jid, in the query string as the
      # release's key.
      def lock_manager_delete_parked_path(key, jid)
        "#{root_path}locks/parked/delete?key=#{CGI.escape(key.to_s)}&jid=#{CGI.escape(jid.to_s)}"
      end

      # A parked job's arguments as escaped JSON text, cut at ARGS_LIMIT characters.
      def lock_manager_args(args)
        text = JSON.generate(args)
        text = "#{text[0, ARGS_LIMIT]}…" if text.length > ARGS_LIMIT
        lock_manager_text(text)
      end
    end
  end
end
