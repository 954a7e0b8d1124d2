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

    MIGRATION_STEP = 0.2 # seconds: the load between the steps of a migration

    # The slot of the plain key process 0 holds in a long section (else key `a`'s) migrated, 100 ms
    # into that section, to another master, as a reshard does it (RedisCluster's begin_migration,
    # migrate_keys, finish_migration; spec/topologies/cluster_faults_spec.rb): the held, renewed
    # lock and its queued waiters move. Once that section ends (target.await at most) the slot is
    # migrated back while the waiters it held take the lock in turn. Each way the slot is
    # MIGRATING/IMPORTING for MIGRATION_STEP, then its keys move, then MIGRATION_STEP more before it
    # is reassigned (within `seconds`). Ends once every node serves the slot from its first master.
    def migrate_slot(target, seconds)
      during = await_long_section(target)
      cluster = target.backend.topology
      key = long_held_key(target)
      slot = KeySlots.slot(key)
      source = cluster.master_for_slot(slot)
      held = target.admin.get(key)
      started = Histories.now
      moved = migrate_once(cluster, slot, (cluster.masters - [source]).first, seconds)
      await_release(target, key, held)
      moved += migrate_once(cluster, slot, source, seconds)
      [{ kind: "slot #{slot} migrated there and back (#{moved} keys moved)", during: during, start: started,
         end: Histories.now }]
    end

    # Until `key` is no longer held by the `token` (target.await at most).
    def await_release(target, key, token)
      deadline = Histories.now + target.await
      sleep 0.01 while token && target.admin.get(key) == token && Histories.now < deadline
    end

    def migrate_once(cluster, slot, to, seconds)
      cluster.begin_migration(slot, to: to)
      sleep MIGRATION_STEP
      moved = cluster.migrate_keys(slot)
      sleep MIGRATION_STEP
      cluster.finish_migration(slot, timeout: seconds)
      moved
    end

    def long_held_key(target)
      plain_keys(target).find { |key| target.admin.get(key).to_s.split("/")[1].to_i == target.pids.first } ||
        plain_keys(target).first
    end
  end
end
