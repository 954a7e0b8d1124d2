# frozen_string_literal: true

require "spec_helper"
require "json"
require "open3"
require "tmpdir"

# Testing mode needs no Redis at all: each example runs a child Ruby whose REDIS_URL points at a
# loopback port where nothing listens (as an app's CI without a redis-server), and fails if anything
# tries to reach it. Sidekiq::Testing and ActiveJob's test adapter change their process for good,
# another reason to run them in a child.
RSpec.describe "LockManager::Testing without Redis" do
  # Runs `args` (a script, or rspec with a file) in a child Ruby on this checkout's lib (and the
  # vendored Sidekiq SIDEKIQ names: RUBYOPT carries it), its REDIS_URL unreachable.
  def run_child(*args)
    load_path = ["-I", File.expand_path("../../lib", __dir__)]
    output, status = Open3.capture2e({ "REDIS_URL" => closed_url }, RbConfig.ruby, *load_path, *args)
    expect(status).to be_success, output
    output
  end

  def in_file(name, source)
    dir = Dir.mktmpdir("lock_manager-testing")
    @dirs = [*@dirs, dir]
    File.join(dir, name).tap { |path| File.write(path, source) }
  end

  after { (@dirs || []).each { |dir| FileUtils.remove_entry(dir) } }

  it "fakes exclusion, waits and claims in a process whose Redis does not exist" do
    output = run_child("-e", <<~RUBY)
      require "json"
      require "lock_manager"
      LockManager::Testing.fake!
      inside = most_inside = 0
      guard = Mutex.new
      Array.new(8) do
        Thread.new do
          20.times do
            LockManager::Locker.blocking_lock("counter", timeout: 5) do
              guard.synchronize { most_inside = [most_inside, inside += 1].max }
              sleep 0.0005
              guard.synchronize { inside -= 1 }
            end
          end
        end
      end.each(&:join)
      holder = Thread.new { LockManager::Locker.new.nonblocking_lock("report", timeout: 30) { sleep 0.3 } }
      sleep 0.05
      started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      LockManager::Locker.blocking_lock("report", timeout: 5) {}
      waited = Process.clock_gettime(Process::CLOCK_MONOTONIC) - started
      holder.join
      claims = LockManager.locker.claim(%w[job job], %w[jid-a jid-b], [60, 60])
      pool = LockManager.locker.pool_state
      LockManager::Testing.real!
      real = begin
        LockManager::Locker.nonblocking_lock("counter") {}
      rescue LockManager::ConnectionError => e
        e.class.name
      end
      puts JSON.generate(most_inside: most_inside, woken_by_release: waited.between?(0.15, 1.0),
                         claims: claims.map(&:class).map(&:name), pool: pool, real: real)
    RUBY

    expect(JSON.parse(output.lines.last)).to eq("most_inside" => 1, "woken_by_release" => true,
                                                "claims" => %w[Integer String], "pool" => [0, 0],
                                                "real" => "LockManager::ConnectionError")
  end

  it "runs an app's RSpec examples of Sidekiq jobs under Sidekiq::Testing fake! and inline!" do
    spec = in_file("jobs_spec.rb", <<~RUBY)
      require "sidekiq"
      require "sidekiq/testing"
      require "lock_manager"
      require "lock_manager/testing/rspec"
      Sidekiq.logger.level = Logger::WARN
      puts "Sidekiq \#{Sidekiq::VERSION}"
      RAN = []

      class ReportJob
        include LockManager::Worker
        lock_with :until_executed, unique_for: 60
        def perform(id) = RAN << id
      end

      class SyncUserJob
        include LockManager::Worker
        lock_with :nonblocking, key: ->(user_id) { "user:\#{user_id}" }
        def perform(user_id) = RAN << LockManager::Locker.instance.locked?("user:\#{user_id}")
      end

      class ResyncJob
        include LockManager::Worker
        lock_with :nonblocking, key: ->(id) { "resync:\#{id}" }, on_conflict: :reschedule, max_reschedules: 2
        def perform(id) = RAN << id
      end

      RSpec.describe "jobs", lock_manager: :fake do
        before do
          RAN.clear
          Sidekiq::Worker.clear_all
        end

        it "fake!: a duplicate push is refused while the first is pending, and accepted once it ran" do
          Sidekiq::Testing.fake! do
            expect(ReportJob.perform_async(1)).to be_a(String)
            expect(ReportJob.perform_async(1)).to be_nil
            expect(ReportJob.perform_async(2)).to be_a(String)
            expect(ReportJob.jobs.size).to eq(2)
            ReportJob.drain
            expect(RAN).to eq([1, 2])
            expect(ReportJob.perform_async(1)).to be_a(String)
          end
        end

        it "inline!: the job runs under its lock, released afterwards" do
          Sidekiq::Testing.inline! do
            expect { SyncUserJob.perform_async(7) }.to lock("user:7")
          end
          expect(RAN).to eq([true])
          expect(LockManager.locker.locked?("user:7")).to be(false)
        end

        it "inline!: a job whose key another holds is skipped" do
          holder = Thread.new { LockManager::Locker.new.try_lock("user:8", timeout: 30) }.value
          Sidekiq::Testing.inline! do
            expect { SyncUserJob.perform_async(8) }.not_to lock("user:8")
          end
          expect(RAN).to eq([])
          holder.release
        end

        it "inline!: a unique job runs at once, and may be pushed again after it ran" do
          Sidekiq::Testing.inline! do
            2.times { ReportJob.perform_async(3) }
          end
          expect(RAN).to eq([3, 3])
        end

        it "fake!: a job whose key another holds comes back with its count, and is skipped past max_reschedules" do
          LockManager.locker.claim(["resync:1"], ["someone-else"], [60])
          Sidekiq::Testing.fake! do
            ResyncJob.perform_async(1)
            ResyncJob.perform_one
            expect(ResyncJob.jobs.map { |job| job["lock_manager_reschedules"] }).to eq([1])
            expect(ResyncJob.jobs.first["at"] - Time.now.to_f).to be_between(0.5, 1.25) # the first: 1 s + up to 25%
            ResyncJob.drain # the fake runs it at once: rescheduled once more, then skipped
            expect(ResyncJob.jobs).to eq([])
          end
          expect(RAN).to eq([])
        end

        it "disabled: every job runs, nothing is refused", lock_manager: :disabled do
          Sidekiq::Testing.fake! do
            3.times { ReportJob.perform_async(4) }
            expect(ReportJob.jobs.size).to eq(3)
          end
        end
      end
    RUBY

    output = run_child(Gem.bin_path("rspec-core", "rspec"), spec)

    expect(output).to include("6 examples, 0 failures")
    require "sidekiq/version"
    expect(output).to include("Sidekiq #{Sidekiq::VERSION}")
  end

  it "runs an app's Minitest tests of ActiveJob jobs with ActiveJob::TestHelper" do
    test = in_file("jobs_test.rb", <<~RUBY)
      require "minitest/autorun"
      require "active_job"
      require "lock_manager"
      require "lock_manager/testing/minitest"
      ActiveJob::Base.logger = Logger.new(nil)
      LockManager::Testing.fake!
      RAN = []

      class SyncUserJob < ActiveJob::Base
        include LockManager::Worker
        lock_with :until_executed, key: ->(user_id) { "sync:\#{user_id}" }, unique_for: 60
        def perform(user_id) = RAN << user_id
      end

      class ReportJob < ActiveJob::Base
        include LockManager::Worker
        lock_with :nonblocking, key: ->(id) { "report:\#{id}" }
        def perform(id) = RAN << LockManager.locker.locked?("report:\#{id}")
      end

      class JobsTest < ActiveJob::TestCase
        def setup
          RAN.clear
        end

        def test_a_duplicate_is_not_enqueued_while_the_first_is_pending
          job = SyncUserJob.perform_later(7)
          refute SyncUserJob.perform_later(7)
          assert_enqueued_jobs 1
          assert_equal job.job_id, LockManager.locker.holder("sync:7")
          perform_enqueued_jobs
          assert_equal [7], RAN
          assert_nil LockManager.locker.holder("sync:7")
          assert SyncUserJob.perform_later(7)
        end

        def test_the_job_runs_under_its_lock
          assert_locked("report:3") { perform_enqueued_jobs { ReportJob.perform_later(3) } }
          assert_equal [true], RAN
        end

        def test_a_job_whose_key_another_holds_is_skipped
          holder = Thread.new { LockManager::Locker.new.try_lock("report:4", timeout: 30) }.value
          refute_locked("report:4") { ReportJob.perform_now(4) }
          assert_empty RAN
          holder.release
        end

        def test_fake_locks_do_not_leak_between_tests
          assert_nil LockManager.locker.holder("sync:7")
          refute LockManager.locker.locked?("report:4")
        end
      end
    RUBY

    output = run_child(test, "--seed", "1")

    expect(output).to include("4 runs, ", " 0 failures, 0 errors")
  end
end
