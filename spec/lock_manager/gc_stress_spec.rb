# frozen_string_literal: true

require "spec_helper"

# Only owned Rust data crosses into GVL-free code: under GC.stress, a Ruby object used there
# would be collected or moved and crash the process.
RSpec.describe "GC safety" do
  it "survives GC.stress with several threads locking" do
    locker = new_locker(pool_size: 3)
    results = Queue.new
    GC.stress = true
    begin
      Array.new(3) do |t|
        Thread.new do
          6.times do |i|
            key = "gc#{t}:#{i}".dup
            results << locker.nonblocking_lock(key, timeout: 5) { "value-#{t}-#{i}" * 3 }.result
            lock = locker.try_lock(key, timeout: 5)
            results << (lock.owned? && lock.refresh(5) && lock.release)
            results << locker.locked?(key)
          end
        end
      end.each(&:join)
    ensure
      GC.stress = false
    end
    values = Array.new(results.size) { results.pop }

    expect(values.size).to eq(54)
    expect(values.grep(String).sort).to eq(Array.new(3) { |t| Array.new(6) { |i| "value-#{t}-#{i}" * 3 } }.flatten.sort)
    expect(values.grep(true).size).to eq(18)
    expect(values.grep(false).size).to eq(18)
  end

  it "survives GC.stress while blocking_lock waits and errors are built" do
    locker = new_locker
    holder = elsewhere.try_lock("held", timeout: 30)
    unreachable = LockManager::Locker.new(redis_url: closed_url)
    errors = []
    GC.stress = true
    begin
      begin
        locker.blocking_lock("held", timeout: 0.05) {}
      rescue LockManager::Error => e
        errors << e
      end
      begin
        unreachable.locked?("k")
      rescue LockManager::Error => e
        errors << e
      end
    ensure
      GC.stress = false
    end

    expect(errors.map(&:class)).to eq([LockManager::LockNotAcquired, LockManager::ConnectionError])
    expect(errors.first.key).to eq("held")
    expect(holder.release).to be(true)
  end
end
