//! What `LockManager::Admin` reads and does, built from the keyspace alone: the locks of a
//! pattern, found by SCAN on every master (never KEYS), with their holders and queued waiters read
//! in pipelines of `BATCH` keys; and the force-release of one key.
//!
//! Nothing here runs on the lock cycle. Who holds a lock is its token (`token.rs`), or the job id
//! a claim was taken with; a semaphore's holders are its sorted set; the queued waiters are the
//! lock's queue, in arrival order, with their details (`lua/shared/queue.lua`).

use std::collections::hash_map::RandomState;
use std::collections::HashSet;
use std::hash::BuildHasher;
use std::sync::Arc;

use redis::{FromRedisValue, RedisError, RedisResult, Value};

use crate::error::LockError;
use crate::gvl::Interrupt;
use crate::keys::LockKeys;
use crate::lock_core::LockCore;
use crate::pool::Pool;
use crate::replies::{classify, refusal, Failure};
use crate::scripts::FORCE_RELEASE;
use crate::token;

/// Keys asked of SCAN per call (its COUNT) and read per pipeline: 1,000 keys are 3,001 commands
/// in one write, and each round trip's replies stay a few hundred kB.
pub const BATCH: usize = 1000;

/// One lock as Redis has it now.
#[derive(Debug, PartialEq)]
pub struct LockView {
    /// Without the key prefix.
    pub key: Vec<u8>,
    /// A `limit: N` semaphore (a sorted set), not a plain lock (a string).
    pub semaphore: bool,
    /// The plain lock's holder, or the semaphore's live ones (earliest expiry first).
    pub holders: Vec<HolderView>,
    /// The live waiters queued for it, in arrival order.
    pub waiters: Vec<WaiterView>,
}

#[derive(Debug, PartialEq)]
pub struct HolderView {
    pub token: Vec<u8>,
    /// Left to live, in ms; `None` for a key without expiry.
    pub ttl_ms: Option<u64>,
}

#[derive(Debug, PartialEq)]
pub struct WaiterView {
    pub token: Vec<u8>,
    /// When it joined the queue: Redis's clock, in µs since the Unix epoch.
    pub since_us: u64,
}

impl LockView {
    /// A semaphore's N, as its holders' and waiters' tokens carry it (Redis keeps no N); their
    /// number when no token says (a lock taken by an older version). `None` for a plain lock.
    pub fn limit(&self) -> Option<u32> {
        if !self.semaphore {
            return None;
        }
        let tokens = self.holders.iter().map(|h| &h.token);
        let tokens = tokens.chain(self.waiters.iter().map(|w| &w.token));
        let said = tokens.filter_map(|t| token::parse(t)?.limit).max();
        Some(said.unwrap_or(self.holders.len() as u32))
    }
}

/// A key to read: the key without its prefix, and the Redis keys of its lock.
struct Target {
    key: Vec<u8>,
    keys: LockKeys,
}

impl Target {
    fn new(core: &LockCore, key: &[u8]) -> Self {
        Target {
            key: key.to_vec(),
            keys: core.keys().lock_keys(key),
        }
    }
}

/// What reading one key found.
enum Read {
    Lock(LockView),
    /// Neither holder nor live waiter, or a key that is no lock (another type).
    Absent,
    /// Its node refused the key (MOVED while a slot migrates): read again on its own.
    Failed(RedisError),
}

impl LockCore {
    /// `key` (without the prefix) as Redis has it now, or `None` when nobody holds it or waits
    /// for it. Two round trips at most (one when no semaphore and no waiter).
    pub fn inspect(
        &self,
        key: &[u8],
        interrupt: &Interrupt,
    ) -> Result<Option<LockView>, LockError> {
        let target = [Target::new(self, key)];
        self.round_trip(
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
    /// look again at once (`lua/force_release.lua`); touches no other key. True when a lock was
    /// removed.
    pub fn force_release(&self, key: &[u8], interrupt: &Interrupt) -> Result<bool, LockError> {
        let lock = self.redis_key(key);
        self.round_trip(&lock, interrupt, None, |conn, _| {
            FORCE_RELEASE
                .run::<i64>(conn, &[&lock], &[])
                .map(|removed| removed == 1)
        })
    }
}

/// Keys (without the prefix) SCAN found on one master, and its pool.
pub type NodeKeys = (Arc<Pool>, Vec<Vec<u8>>);

/// A SCAN of the locks of one pattern over every master, a batch at a time. A key SCAN returns
/// twice (it may, while Redis resizes its tables) is given once.
pub struct Scan {
    /// MATCH: the key prefix, its glob characters escaped, then the caller's pattern.
    matching: Vec<u8>,
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
        Scan {
            matching: core.keys().key_pattern(pattern),
            masters: None,
            node: 0,
            cursor: 0,
            seen: HashSet::new(),
            hasher: RandomState::new(),
        }
    }

    /// The next keys (without the prefix) of one master: about `BATCH`, fewer when it has no
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
        let prefix_len = core.keys().prefix().len();
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
                if key.len() >= prefix_len && self.seen.insert(self.hasher.hash_one(key.as_slice()))
                {
                    keys.push(key[prefix_len..].to_vec());
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

/// Runs `command` on a connection of `pool` (one node), replacing a connection that died while
/// idle as `LockCore::round_trip` does; for commands about no one key (SCAN).
fn on_node<T>(
    pool: &Pool,
    interrupt: &Interrupt,
    mut command: impl FnMut(&mut redis::Connection) -> RedisResult<T>,
) -> Result<T, LockError> {
    let retry_limit = pool.settings().pool_size + 1;
    let mut retries = 0;
    loop {
        let mut conn = pool.checkout(interrupt)?;
        interrupt.check()?;
        let error = match command(&mut conn.redis) {
            Ok(value) => return Ok(value),
            Err(error) => error,
        };
        let failure = classify(error, false, interrupt.takes_signals_to_ruby());
        conn.poisoned = !failure.keeps_connection();
        drop(conn);
        match failure {
            Failure::Dropped(_) | Failure::Signalled(_) if retries < retry_limit => retries += 1,
            Failure::Interrupted => return Err(LockError::Interrupted),
            Failure::Refused(error) => return Err(refusal(&pool.addr(), &error)),
            Failure::Dropped(error) | Failure::Signalled(error) | Failure::Unusable(error) => {
                return Err(LockError::Connection {
                    addr: pool.addr(),
                    cause: error.to_string(),
                    timed_out: error.is_timeout(),
                    undone: false,
                })
            }
        }
    }
}

/// Reads `targets`, all served by the node of `conn`: one pipeline of `TIME` and, per key, `GET`
/// (its holder's token, or WRONGTYPE for a semaphore), `PTTL` and its queue; a second one only for
/// semaphores (their holders) and queues (their waiters' heartbeats). Replies are read one at a
/// time, as `scripts::acquire` reads its two.
fn read_locks(conn: &mut redis::Connection, targets: &[Target]) -> RedisResult<Vec<Read>> {
    let mut first = redis::pipe();
    first.cmd("TIME");
    for target in targets {
        first.cmd("GET").arg(&target.keys.lock);
        first.cmd("PTTL").arg(&target.keys.lock);
        first
            .cmd("ZRANGE")
            .arg(&target.keys.queue)
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES");
    }
    conn.send_packed_command(&first.get_packed_pipeline())?;
    let now_ms = redis_ms(conn.recv_response()?.extract_error()?)?;
    let mut found = Vec::with_capacity(targets.len());
    for _ in targets {
        let holder = conn.recv_response()?;
        let pttl = conn.recv_response()?;
        let queue = conn.recv_response()?;
        found.push((holder, pttl, queue));
    }

    let mut second = redis::pipe();
    let mut asked = 0;
    let mut shapes = Vec::with_capacity(targets.len());
    for (target, (holder, pttl, queue)) in targets.iter().zip(found) {
        let shape = Shape::of(holder, pttl, queue);
        if let Shape::Other {
            semaphore: true, ..
        } = &shape
        {
            second
                .cmd("ZRANGE")
                .arg(&target.keys.lock)
                .arg(0)
                .arg(-1)
                .arg("WITHSCORES");
            asked += 1;
        }
        if let Shape::Plain { queue, .. } | Shape::Other { queue, .. } = &shape {
            if !queue.is_empty() {
                second.cmd("HMGET").arg(&target.keys.waiters);
                for (token, _) in queue {
                    second.arg(token);
                }
                asked += 1;
            }
        }
        shapes.push(shape);
    }
    if asked > 0 {
        conn.send_packed_command(&second.get_packed_pipeline())?;
    }
    let mut reads = Vec::with_capacity(targets.len());
    for (target, shape) in targets.iter().zip(shapes) {
        let (semaphore, holders, queue) = match shape {
            Shape::Failed(error) => {
                reads.push(Read::Failed(error));
                continue;
            }
            Shape::Plain { holder, queue } => (false, holder.into_iter().collect(), queue),
            Shape::Other { semaphore, queue } => {
                let holders = match semaphore {
                    true => semaphore_holders(conn.recv_response()?, now_ms),
                    false => Some(Vec::new()),
                };
                match holders {
                    Some(holders) => (semaphore, holders, queue),
                    None => (false, Vec::new(), queue), // another type of key: no lock
                }
            }
        };
        let waiters = match queue.is_empty() {
            true => Vec::new(),
            false => live_waiters(queue, conn.recv_response()?, now_ms),
        };
        reads.push(if holders.is_empty() && waiters.is_empty() {
            Read::Absent
        } else {
            Read::Lock(LockView {
                key: target.key.clone(),
                semaphore,
                holders,
                waiters,
            })
        });
    }
    Ok(reads)
}

/// What the first pipeline said of one key.
enum Shape {
    /// A string: a plain lock, its holder (`None`: gone) and queue.
    Plain {
        holder: Option<HolderView>,
        queue: Vec<(Vec<u8>, u64)>,
    },
    /// Not a string: a semaphore, maybe (WRONGTYPE to GET), or no key at all.
    Other {
        semaphore: bool,
        queue: Vec<(Vec<u8>, u64)>,
    },
    Failed(RedisError),
}

impl Shape {
    fn of(holder: Value, pttl: Value, queue: Value) -> Shape {
        let queue = match queue.extract_error() {
            Ok(queue) => scored(queue),
            Err(error) => return Shape::Failed(error),
        };
        match holder.extract_error() {
            Ok(Value::BulkString(token)) => {
                let ttl_ms = match pttl {
                    Value::Int(-1) => None,
                    Value::Int(ms) => Some(ms.max(0) as u64),
                    _ => None,
                };
                Shape::Plain {
                    holder: Some(HolderView { token, ttl_ms }),
                    queue,
                }
            }
            Ok(_) => Shape::Other {
                semaphore: false,
                queue,
            },
            Err(error) if error.code() == Some("WRONGTYPE") => Shape::Other {
                semaphore: true,
                queue,
            },
            Err(error) => Shape::Failed(error),
        }
    }
}

/// A semaphore's live holders (`ZRANGE ... WITHSCORES`: token -> expiry in Redis ms), or `None`
/// when the key is no sorted set.
fn semaphore_holders(reply: Value, now_ms: u64) -> Option<Vec<HolderView>> {
    let members = reply.extract_error().ok()?;
    Some(
        scored(members)
            .into_iter()
            .filter(|&(_, expiry)| expiry > now_ms)
            .map(|(token, expiry)| HolderView {
                token,
                ttl_ms: Some(expiry - now_ms),
            })
            .collect(),
    )
}

/// The queue's waiters whose heartbeat still runs (`HMGET` of their details, in queue order:
/// "<heartbeat deadline ms>:<ttl ms>:<channel>"), in arrival order.
fn live_waiters(queue: Vec<(Vec<u8>, u64)>, details: Value, now_ms: u64) -> Vec<WaiterView> {
    let details = match details.extract_error() {
        Ok(Value::Array(details)) => details,
        _ => return Vec::new(),
    };
    queue
        .into_iter()
        .zip(details)
        .filter(|(_, detail)| heartbeat_deadline(detail).is_some_and(|deadline| deadline > now_ms))
        .map(|((token, since_us), _)| WaiterView { token, since_us })
        .collect()
}

fn heartbeat_deadline(detail: &Value) -> Option<u64> {
    let Value::BulkString(text) = detail else {
        return None;
    };
    let end = text.iter().position(|&b| b == b':')?;
    std::str::from_utf8(&text[..end]).ok()?.parse().ok()
}

/// The members of `ZRANGE ... WITHSCORES` with their integer scores, in order: RESP2's flat
/// member, score, member, score, or RESP3's pairs.
fn scored(reply: Value) -> Vec<(Vec<u8>, u64)> {
    let Value::Array(items) = reply else {
        return Vec::new();
    };
    let mut flat = Vec::with_capacity(items.len());
    for item in items {
        match item {
            Value::Array(pair) => flat.extend(pair),
            single => flat.push(single),
        }
    }
    let mut members = Vec::with_capacity(flat.len() / 2);
    let mut items = flat.into_iter();
    while let (Some(member), Some(score)) = (items.next(), items.next()) {
        if let (Value::BulkString(member), Some(score)) = (member, score_of(&score)) {
            members.push((member, score));
        }
    }
    members
}

fn score_of(score: &Value) -> Option<u64> {
    match score {
        Value::BulkString(text) => {
            let text = std::str::from_utf8(text).ok()?;
            text.parse::<u64>()
                .ok()
                .or_else(|| Some(text.parse::<f64>().ok()? as u64))
        }
        Value::Double(score) => Some(*score as u64),
        Value::Int(score) => u64::try_from(*score).ok(),
        _ => None,
    }
}

/// Redis's clock in ms, from `TIME`.
fn redis_ms(time: Value) -> RedisResult<u64> {
    let (seconds, micros): (u64, u64) = FromRedisValue::from_redis_value(time)?;
    Ok(seconds * 1000 + micros / 1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(text: &str) -> Value {
        Value::BulkString(text.as_bytes().to_vec())
    }

    #[test]
    fn scores_come_flat_or_in_pairs() {
        let flat = Value::Array(vec![
            bulk("a"),
            bulk("1763803362123457"),
            bulk("b"),
            bulk("2"),
        ]);
        assert_eq!(
            scored(flat),
            vec![(b"a".to_vec(), 1_763_803_362_123_457), (b"b".to_vec(), 2)]
        );
        let pairs = Value::Array(vec![Value::Array(vec![bulk("a"), Value::Double(5.0)])]);
        assert_eq!(scored(pairs), vec![(b"a".to_vec(), 5)]);
        assert_eq!(scored(Value::Nil), vec![]);
    }

    #[test]
    fn only_semaphore_holders_that_have_not_expired_hold() {
        let reply = Value::Array(vec![bulk("old"), bulk("900"), bulk("new"), bulk("1500")]);
        let holders = semaphore_holders(reply, 1000).unwrap();
        assert_eq!(
            holders,
            vec![HolderView {
                token: b"new".to_vec(),
                ttl_ms: Some(500)
            }]
        );
        let wrong_type = redis::parse_redis_value(b"-WRONGTYPE Operation against a key\r\n");
        assert_eq!(semaphore_holders(wrong_type.unwrap(), 1000), None);
    }

    #[test]
    fn only_waiters_whose_heartbeat_runs_are_listed_in_order() {
        let queue = vec![
            (b"a".to_vec(), 10),
            (b"dead".to_vec(), 20),
            (b"c".to_vec(), 30),
        ];
        let details = Value::Array(vec![bulk("2000:30000:ch"), bulk("900:30000:"), Value::Nil]);
        let waiters = live_waiters(queue, details, 1000);
        assert_eq!(
            waiters,
            vec![WaiterView {
                token: b"a".to_vec(),
                since_us: 10
            }]
        );
    }

    #[test]
    fn a_semaphores_limit_is_what_its_tokens_say() {
        let holder = |token: &str| HolderView {
            token: token.as_bytes().to_vec(),
            ttl_ms: Some(1),
        };
        let mut view = LockView {
            key: b"k".to_vec(),
            semaphore: true,
            holders: vec![
                holder(&token::format_token("h", 1, 2, 3, 4, 3)),
                holder("jid"),
            ],
            waiters: vec![],
        };
        assert_eq!(view.limit(), Some(3));
        view.holders = vec![holder("older-token"), holder("another")];
        assert_eq!(view.limit(), Some(2));
        view.semaphore = false;
        assert_eq!(view.limit(), None);
    }

    #[test]
    fn the_redis_clock_is_read_in_ms() {
        let time = Value::Array(vec![bulk("1763803362"), bulk("123456")]);
        assert_eq!(redis_ms(time).unwrap(), 1_763_803_362_123);
    }
}
