# frozen_string_literal: true

require "spec_helper"
require "json"
require "open3"
require "sidekiq"
require_relative "../support/sidekiq_process"

# Apps test their jobs with Sidekiq's testing modes (fake and inline): locks apply there too, whether
# the testing API was loaded before the job classes or after them (an app that eager-loads its classes
# first, as Rails' test environment does when CI is set), through `require "sidekiq/testing"` or
# Sidekiq 8.1's `Sidekiq.testing!`. Each example runs in a child process, since the testing API
# changes Sidekiq for the whole process it is loaded in.
SIDEKIQ_TESTING_PRELUDE = <<~RUBY
  require "json"
  require "sidekiq"
  require "lock_manager"
  LockManager.configure { |c| c.redis_url = ENV["REDIS_URL"]; c.key_prefix = ENV["LOCK_PREFIX"] }
  Sidekiq.logger.level = Logger::WARN
RUBY

SIDEKIQ_TESTING_JOBS = <<~RUBY
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

RSpec.describe "Sidekiq's testing modes with lock_manager" do
  # Each API: how it loads the testing modes, and how a script switches to one (fake, inline).
  apis = {
    'require "sidekiq/testing"' => { load: 'require "sidekiq/testing"', mode: "Sidekiq::Testing.%s!" },
    "Sidekiq.testing! (8.1)" => { load: "Sidekiq.testing!(:fake)", mode: "Sidekiq.testing!(:%s)", new: true }
  }

  def run_script(body, api:, testing_first:)
    loads = [api[:load], SIDEKIQ_TESTING_JOBS]
    script = [SIDEKIQ_TESTING_PRELUDE, *(testing_first ? loads : loads.reverse), body].join("\n")
    load_path = ["-I", File.expand_path("../../lib", __dir__)] # the same Sidekiq: RUBYOPT carries SIDEKIQ's
    output, status = Open3.capture2e({ "REDIS_URL" => redis_url, "LOCK_PREFIX" => prefix }, RbConfig.ruby,
                                     *load_path, "-e", "#{script}\nputs Sidekiq::VERSION")
    expect(status).to be_success, output
    expect(output.lines.last.strip).to eq(Sidekiq::VERSION)
    JSON.parse(output.lines[-2])
  end

  apis.each do |name, api|
    { "before the job classes" => true, "after the job classes" => false }.each do |order, testing_first|
      context "#{name}, loaded #{order}" do
        missing = api[:new] && !Sidekiq.respond_to?(:testing!)
        before { skip "Sidekiq #{Sidekiq::VERSION} has no Sidekiq.testing! (new in 8.1)" } if missing

        it "fake: a duplicate push is refused until the pending job is drained; drained jobs run under their lock" do
          result = run_script(<<~RUBY, api: api, testing_first: testing_first)
            #{format(api[:mode], "fake")}
            pushes = [UniqueJob.perform_async(1), UniqueJob.perform_async(1), UniqueJob.perform_async(2)]
            queued = UniqueJob.jobs.size
            UniqueJob.drain
            again = UniqueJob.perform_async(1)
            RunLockedJob.perform_async
            RunLockedJob.drain
            puts JSON.generate(pushes: pushes.map { |jid| !jid.nil? }, queued: queued, ran: $ran, again: !again.nil?)
          RUBY

          expect(result).to eq("pushes" => [true, false, true], "queued" => 2, "ran" => [1, 2, true], "again" => true)
        end

        it "inline: the job runs under its lock, which is gone afterwards" do
          result = run_script(<<~RUBY, api: api, testing_first: testing_first)
            #{format(api[:mode], "inline")}
            RunLockedJob.perform_async
            UniqueJob.perform_async(3)
            puts JSON.generate(ran: $ran, left: LockManager::Locker.instance.locked?("run-locked"))
          RUBY

          expect(result).to eq("ran" => [true, 3], "left" => false)
          expect(redis.keys("#{prefix}*")).to eq([])
        end
      end
    end
  end
end
