# frozen_string_literal: true

require "spec_helper"
require "logger"
require "stringio"
require_relative "../support/lock_backend_examples"

# The behaviour the testing mode's fake is held to (spec/testing/fake_spec.rb runs the same examples), on Redis.
RSpec.describe "Locks on Redis, as the fake must behave" do
  let(:log) { StringIO.new }
  let(:locker) { LockManager::Locker.new(key_prefix: prefix) }
  let(:elsewhere) { LockManager::Locker.new(key_prefix: prefix) }

  before do
    LockManager.configure do |c|
      c.logger = Logger.new(log)
      c.key_prefix = prefix
    end
  end

  # A waiter on Redis is queued once the lock's queue holds it.
  def await_queued(_waiter, key, count)
    eventually { redis.zcard(queue_key("#{prefix}#{key}")) == count }
  end

  include_examples "a lock backend"

  describe "claims" do
    include_examples "claims of a lock backend"
  end
end
