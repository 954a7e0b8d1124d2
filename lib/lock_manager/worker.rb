# frozen_string_literal: true

# `include LockManager::Worker`, as apps require it (`require "lock_manager/worker"`); it lives in jobs/worker.rb.
require_relative "jobs/worker"
