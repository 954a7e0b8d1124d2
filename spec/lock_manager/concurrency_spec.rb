# frozen_string_literal: true

require "spec_helper"

# Threads of one process: spec/lock_manager/backends_spec.rb (the shared examples of both backends).
RSpec.describe "Mutual exclusion and the GVL" do
  let(:locker) { new_locker(pool_size: 8) }

  it "excludes across processes: 4 forked processes never overlap" do
    url = redis_url
    key_prefix = prefix # fixed before fork: each child would otherwise draw its own
    pids = Array.new(4) do |worker|
      fork do
        child = LockManager::Locker.new(redis_url: url, key_prefix: key_prefix)
        marks = Redis.new(url: url)
        20.times do
          child.blocking_lock("shared", timeout: 20) do
            marks.rpush("#{key_prefix}marks", "in:#{worker}")
            sleep 0.002
            marks.rpush("#{key_prefix}marks", "out:#{worker}")
          end
        end
        exit!(0)
      end
    end
    statuses = pids.map { |pid| Process.wait2(pid).last }
    marks = redis.lrange("#{prefix}marks", 0, -1)

    expect(statuses).to all(be_success)
    expect(marks.size).to eq(160)
    marks.each_slice(2) { |entry, exit| expect(exit).to eq(entry.sub("in:", "out:")) }
  end

  it "keeps other Ruby threads running while a thread waits" do
    elsewhere.try_lock("held", timeout: 30)
    counter = 0
    counting = Thread.new { loop { counter += 1 } }
    expect { locker.blocking_lock("held", timeout: 1) {} }.to raise_error(LockManager::LockNotAcquired)
    counting.kill.join

    # A wait that held the GVL would leave the counter at (almost) zero.
    expect(counter).to be > 1_000_000
  end

  it "waits for 8 keys in parallel, not one after another" do
    8.times { |i| locker.try_lock("k#{i}", timeout: 0.5) }
    took = elapsed do
      Array.new(8) { |i| Thread.new { locker.blocking_lock("k#{i}", timeout: 10) { :ok } } }.each(&:join)
    end

    # Serial waits would take 8 x 0.5 s.
    expect(took).to be_between(0.4, 2.0)
  end
end
