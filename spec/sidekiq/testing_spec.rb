# frozen_string_literal: true

require "spec_helper"
require "json"
require "open3"
require "sidekiq"
require_relative "../support/sidekiq_process"

# Apps test their jobs with Sidekiq::Testing (fake and inline): locks apply there too. Each
# example runs in a child process, since requiring sidekiq/testing changes Sidekiq for the
# whole process it is loaded in.
SIDEKIQ_TESTING_APP = <<~RUBY
  require "json"
  require "sidekiq"
  require "sidekiq/testing"
  require "lock_manager"
  LockManager.configure { |c| c.redis_url = ENV["REDIS_URL"]; c.key_prefix = ENV["LOCK_PREFIX"] }
  Sidekiq.logger.level = Logger::WARN
  class UniqueJob
    include LockManager::Worker
    lock_with :until_executed, unique_for: 60
    def perform(id) = ($ran ||= []) << id
  end
  class RunLockedJob
    include LockManager::Worker
    lock_with :nonblocking, key: "run-locked"
    def perform = ($ran ||= []) << LockManager::Locker.instance.locked?("run-locked")
  end
RUBY

RSpec.describe "Sidekiq::Testing with lock_manager" do
  def run_script(body)
    script = "#{SIDEKIQ_TESTING_APP}\n#{body}"
    load_path = ["-I", File.expand_path("../../lib", __dir__)] # the same Sidekiq: RUBYOPT carries SIDEKIQ's
    output, status = Open3.capture2e({ "REDIS_URL" => redis_url, "LOCK_PREFIX" => prefix }, RbConfig.ruby,
                                     *load_path, "-e", "#{script}\nputs Sidekiq::VERSION")
    expect(status).to be_success, output
    expect(output.lines.last.strip).to eq(Sidekiq::VERSION)
    JSON.parse(output.lines[-2])
  end

  it "fake!: a duplicate push is refused until the pending job is drained, then accepted again" do
    result = run_script(<<~RUBY)
      Sidekiq::Testing.fake!
      pushes = [UniqueJob.perform_async(1), UniqueJob.perform_async(1), UniqueJob.perform_async(2)]
      queued = UniqueJob.jobs.size
      UniqueJob.drain
      again = UniqueJob.perform_async(1)
      puts JSON.generate(pushes: pushes.map { |jid| !jid.nil? }, queued: queued, ran: $ran, again: !again.nil?)
    RUBY

    expect(result).to eq("pushes" => [true, false, true], "queued" => 2, "ran" => [1, 2], "again" => true)
  end

  it "inline!: the job runs under its lock, which is gone afterwards" do
    result = run_script(<<~RUBY)
      Sidekiq::Testing.inline!
      RunLockedJob.perform_async
      UniqueJob.perform_async(3)
      puts JSON.generate(ran: $ran, left: LockManager::Locker.instance.locked?("run-locked"))
    RUBY

    expect(result).to eq("ran" => [true, 3], "left" => false)
    expect(redis.keys("#{prefix}*")).to eq([])
  end
end
