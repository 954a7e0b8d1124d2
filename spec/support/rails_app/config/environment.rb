# frozen_string_literal: true

require_relative "application"

Rails.application.initialize!

# A fresh database per run, in WAL mode (Rails 7.1's default for SQLite): readers never wait for a writer, and a
# transaction that read before another one committed fails at its first write at once ("database is locked")
# instead of waiting in SQLite's busy handler, which holds Ruby's GVL and so freezes every thread of the worker.
ActiveRecord::Schema.verbose = false
unless ActiveRecord::Base.connection.table_exists?(:bookings)
  ActiveRecord::Base.connection.execute("PRAGMA journal_mode = WAL")
  load File.expand_path("../db/schema.rb", __dir__)
end
ActiveRecord::Base.connection_pool.disconnect!

# A --preload master that locks before it forks its workers (as an app guarding a boot task does): the workers,
# forked right after, lock with no after-fork hook (see docs/rails.md, "Puma, Spring, forking servers").
LockManager::Locker.nonblocking_lock("boot") { nil } if ENV["LOCK_AT_BOOT"]
