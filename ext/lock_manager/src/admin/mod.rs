//! What `LockManager::Admin` reads and does, built from the keyspace alone: the locks of a
//! pattern, found by SCAN on every master (never KEYS), with their holders and queued waiters read
//! in pipelines of `BATCH` keys (with how many jobs are parked on each); and the force-release of
//! one key.
//!
//! Nothing here runs on the lock cycle. Who holds a lock is its token (`token.rs`), or the job id
//! a claim was taken with; a semaphore's holders are its sorted set; the queued waiters are the
//! lock's queue, in arrival order, with their details (`lua/shared/queue.lua`).

use std::collections::hash_map::RandomState;
use std::collections::HashSet;
use std::hash::BuildHasher;
use std::sync::Arc;

use crate::error::LockError;
use crate::gvl::Interrupt;
use crate::lock_core::LockCore;
use crate::pool::Pool;
use crate::scripts::FORCE_RELEASE;
use crate::transport::on_node;

mod limiters;
mod views;

pub use limiters::LimiterView;
use views::{read_locks, Read, Target};
pub use views::{HolderView, LockView, WaiterView};

/// Keys asked of SCAN per call (its COUNT) and read per pipeline: 1,000 keys are 4,001 commands
/// in one write, and each round trip's replies stay a few hundred kB.
pub const BATCH: usize = 1000;

impl LockCore {
    /// `key` (without the prefix) as Redis has it now, or `None` when nobody holds it, waits for
    /// it or is parked on it. Two round trips at most (one when no semaphore and no waiter).
    pub fn inspect(
        &self,
        key: &[u8],
        interrupt: &Interrupt,
    ) -> Result<Option<LockView>, LockError> {
        let target = [Target::new(self, key)];
        self.pool().round_trip(
            &target[0].keys.lock,
            interrupt,
            None,
            |conn, _| match read_locks(conn, &target)?.pop() {
                Some(Read::Lock(view)) => Ok(Some(view)),
                Some(Read::Failed(error)) => Err(error),
                Some(Read::Absent) | None => Ok(None),
            },
        )
    }

    /// Each of `keys` (without the prefix) as `inspect` reads it, in pipelines of `BATCH` per
    /// node (a key whose node refused it is read again on its own).
    pub fn inspect_all(
        &self,
        keys: &[Vec<u8>],
        interrupt: &Interrupt,
    ) -> Result<Vec<Option<LockView>>, LockError> {
        let mut by_node: Vec<(Arc<Pool>, Vec<usize>)> = Vec::new();
        for (at, key) in keys.iter().enumerate() {
            let pool = self.pool().pool_for(&self.redis_key(key))?;
            match by_node
                .iter_mut()
                .find(|(known, _)| Arc::ptr_eq(known, &pool))
            {
                Some((_, indices)) => indices.push(at),
                None => by_node.push((pool, vec![at])),
            }
        }
        let mut views: Vec<Option<LockView>> = keys.iter().map(|_| None).collect();
        for (pool, indices) in by_node {
            for chunk in indices.chunks(BATCH) {
                let targets: Vec<Target> = chunk
                    .iter()
                    .map(|&at| Target::new(self, &keys[at]))
                    .collect();
                let reads = on_node(&pool, interrupt, |conn| read_locks(conn, &targets))?;
                for (&at, read) in chunk.iter().zip(reads) {
                    views[at] = match read {
                        Read::Lock(view) => Some(view),
                        Read::Absent => None,
                        Read::Failed(_) => self.inspect(&keys[at], interrupt)?,
                    };
                }
            }
        }
        Ok(views)
    }

    /// Removes every holder of `key` (without the prefix), whoever they are, and has its waiters
    /// look again at once (`lua/force_release.lua`); the first job parked on it, if any, takes it.
    /// True when a lock was removed.
    pub fn force_release(&self, key: &[u8], interrupt: &Interrupt) -> Result<bool, LockError> {
        let lock = self.redis_key(key);
        let parked = self.keys().parked(key);
        let keys: &[&[u8]] = if self.pool().is_cluster() {
            &[&lock]
        } else {
            &[&lock, &parked]
        };
        self.pool().round_trip(&lock, interrupt, None, |conn, _| {
            FORCE_RELEASE
                .run::<i64>(conn, keys, &[])
                .map(|removed| removed == 1)
        })
    }
}

/// Keys (without the prefix) SCAN found on one master, and its pool.
pub type NodeKeys = (Arc<Pool>, Vec<Vec<u8>>);

/// A SCAN of the locks (or the limiters) of one pattern over every master, a batch at a time. A
/// key SCAN returns twice (it may, while Redis resizes its tables) is given once.
pub struct Scan {
    /// MATCH: the key prefix, its glob characters escaped, then the caller's pattern.
    matching: Vec<u8>,
    /// What is cut from the front of each key found: the key prefix of a lock's key.
    strip: usize,
    masters: Option<Vec<Arc<Pool>>>,
    /// The master being scanned, and its cursor.
    node: usize,
    cursor: u64,
    /// Hashes of the keys given so far (8 bytes a key, where the keys themselves may be long).
    seen: HashSet<u64>,
    hasher: RandomState,
}

impl Scan {
    /// `pattern`: a Redis glob over keys without the prefix.
    pub fn new(core: &LockCore, pattern: &[u8]) -> Self {
        Self::matching(core.keys().key_pattern(pattern), core.keys().prefix().len())
    }

    /// The limiters' keys (whole) whose names match `pattern`, a Redis glob.
    pub fn limiters(core: &LockCore, pattern: &[u8]) -> Self {
        Self::matching(core.keys().limiter_pattern(pattern), 0)
    }

    fn matching(matching: Vec<u8>, strip: usize) -> Self {
        Scan {
            matching,
            strip,
            masters: None,
            node: 0,
            cursor: 0,
            seen: HashSet::new(),
            hasher: RandomState::new(),
        }
    }

    /// The next keys (without the prefix, for locks) of one master: about `BATCH`, fewer when it has no
    /// more; `None` once every master is done. Nothing changes unless it succeeds, so a call cut
    /// short may be made again.
    pub fn next_keys(
        &mut self,
        core: &LockCore,
        interrupt: &Interrupt,
    ) -> Result<Option<NodeKeys>, LockError> {
        if self.masters.is_none() {
            self.masters = Some(core.pool().masters()?);
        }
        loop {
            let Some(pool) = self
                .masters
                .as_ref()
                .and_then(|m| m.get(self.node))
                .cloned()
            else {
                return Ok(None);
            };
            let (cursor, found) = on_node(&pool, interrupt, |conn| {
                let mut cursor = self.cursor;
                let mut found = Vec::new();
                loop {
                    let (next, keys): (String, Vec<Vec<u8>>) = redis::cmd("SCAN")
                        .arg(cursor)
                        .arg("MATCH")
                        .arg(&self.matching)
                        .arg("COUNT")
                        .arg(BATCH)
                        .query(conn)?;
                    cursor = next.parse().unwrap_or(0);
                    found.extend(keys);
                    if cursor == 0 || found.len() >= BATCH {
                        return Ok((cursor, found));
                    }
                }
            })?;
            let mut keys = Vec::with_capacity(found.len());
            for key in found {
                if key.len() >= self.strip && self.seen.insert(self.hasher.hash_one(key.as_slice()))
                {
                    keys.push(key[self.strip..].to_vec());
                }
            }
            self.cursor = cursor;
            if cursor == 0 {
                self.node += 1;
            }
            if !keys.is_empty() {
                return Ok(Some((pool, keys)));
            }
        }
    }

    /// The next locks, read on the master SCAN found them on; `None` once every master is done.
    pub fn next_locks(
        &mut self,
        core: &LockCore,
        interrupt: &Interrupt,
    ) -> Result<Option<Vec<LockView>>, LockError> {
        let (node, cursor) = (self.node, self.cursor);
        let Some((pool, keys)) = self.next_keys(core, interrupt)? else {
            return Ok(None);
        };
        let targets: Vec<Target> = keys.iter().map(|key| Target::new(core, key)).collect();
        let reads = match on_node(&pool, interrupt, |conn| read_locks(conn, &targets)) {
            Ok(reads) => reads,
            Err(error) => {
                // Keys handed out by no one: the batch is scanned again by the next call.
                (self.node, self.cursor) = (node, cursor);
                for key in &keys {
                    self.seen
                        .remove(&self.hasher.hash_one(core.redis_key(key).as_slice()));
                }
                return Err(error);
            }
        };
        let mut views = Vec::with_capacity(reads.len());
        for (target, read) in targets.iter().zip(reads) {
            match read {
                Read::Lock(view) => views.push(view),
                Read::Absent => {}
                Read::Failed(_) => views.extend(core.inspect(&target.key, interrupt)?),
            }
        }
        Ok(Some(views))
    }
}
