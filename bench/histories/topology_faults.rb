# frozen_string_literal: true

module Histories
  # The faults of a Sentinel set or a Cluster (Backends::Sentinel, Backends::Cluster), injected as
  # Faults' are (the same records; see faults.rb). Their end is the moment the topology serves
  # again: the sentinels name the promoted replica, or every live cluster node agrees on a full
  # slot map without the dead master.
  module Faults
    module_function

    # The primary SIGKILLed 100 ms into a long section; once the sentinels name the replica, the
    # killed primary is started again (empty: no persistence) for the sentinels to make it the new
    # primary's replica (with `min_replicas: 1` nothing is granted until it replicates). The
    # sentinels have `seconds` to promote it.
    def failover(target, seconds)
      during = await_long_section(target)
      set = target.backend.topology
      started = Histories.now
      set.kill_primary
      set.wait_for_failover(timeout: seconds)
      ended = Histories.now
      set.restart_old_primary
      [{ kind: "sigkill of the primary, failover", during: during, start: started, end: ended }]
    end

    # SIGKILL of the master serving the plain key process 0 holds in a long section (else key
    # `a`'s), 100 ms into it; ends when its replica serves its slots (within `seconds`).
    def kill_master(target, seconds)
      during = await_long_section(target)
      cluster = target.backend.topology
      master = cluster.master_for_slot(KeySlots.slot(long_held_key(target)))
      started = Histories.now
      cluster.kill_master(master)
      cluster.wait_for_failover(master, timeout: seconds)
      [{ kind: "sigkill of a master, failover", during: during, start: started, end: Histories.now }]
    end

    def long_held_key(target)
      plain_keys(target).find { |key| target.admin.get(key).to_s.split("/")[1].to_i == target.pids.first } ||
        plain_keys(target).first
    end
  end
end
