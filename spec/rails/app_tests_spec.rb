# frozen_string_literal: true

require "spec_helper"
require_relative "../support/rails_app_server"

# The Rails app's own tests (spec/support/rails_app/test), run as an app runs them: Minitest with rails/test_help,
# transactional tests, ActionDispatch::IntegrationTest; in a child process, on the stack's Rails.
RSpec.describe "the Rails app's own tests", :rails do
  # Every test ran and passed.
  def run_tests(file, env = {})
    out, status = RailsAppServer.test(file, env: { "REDIS_URL" => redis_url, "LOCK_PREFIX" => prefix }.merge(env))
    expect(status).to be_success, out
    expect(out).to match(/^5 runs, \d+ assertions, 0 failures, 0 errors, 0 skips$/)
  end

  it "with_semaphore_lock(release: :after_commit) behaves as after_commit callbacks do in transactional tests" do
    run_tests("test/lockable_test.rb")
  end

  it "the same with LockManager::Testing.fake!" do
    run_tests("test/lockable_test.rb", "LOCKS" => "fake")
  end
end
