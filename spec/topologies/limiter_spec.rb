# frozen_string_literal: true

require "spec_helper"
require_relative "../support/topologies"
require_relative "../support/limiter_hammer"

# Limiters on the suite's Redis Cluster (3 masters): each limiter's one key lies on the master of
# its name's slot, and counts there exactly.
RSpec.describe "Limiters on a Redis Cluster", :topology do
  include LimiterHammer

  let(:cluster) { RedisCluster.shared }
  let(:locker) { LockManager::Locker.new(cluster: cluster.seed_urls, key_prefix: prefix) }

  it "decides on the master of each name's slot, one key there, for every kind" do
    names = cluster.keys_on_each_master(1, base: "limiter", prefix: prefix).transform_values(&:first)
    expect(names.size).to eq(3)

    names.each do |master, name|
      limiters = [LockManager::Limiter.new(name, rate: 1, per: 60, burst: 2, locker: locker),
                  LockManager::Limiter.window(name, 2, per: 3600, locker: locker),
                  LockManager::Limiter.sliding_window(name, 2, per: 60, locker: locker)]
      limiters.each do |limiter|
        expect(Array.new(3) { limiter.try_acquire.admitted? }).to eq([true, true, false])
      end
      expect(node_client(master).keys("lock_manager:*:limit:*:#{prefix}#{name}").size).to eq(3)
    end
  end

  # The hammer of spec/faults/limiter_faults_spec.rb (issue 27) through the Cluster: the GCRA limiter on
  # one master, the window limiter on another, every child process a Cluster client of its own.
  it "admits exactly the rule across processes of threads hammering one GCRA and one window limiter", timeout: 120 do
    processes, threads, seconds = ENV.fetch("LM_HAMMER", "20x10x10").split("x").map(&:to_f)
    names = cluster.keys_on_each_master(1, base: "hammer", prefix: prefix).values.flatten.first(2)
    run = hammer_limiters(locker: { cluster: cluster.seed_urls }, names: names, processes: processes.to_i,
                          threads: threads.to_i, seconds: seconds, rule: { rate: 20, burst: 5, window: 30, per: 2 })
    expect_within_the_rules(run, share: 0.95)
  end
end
