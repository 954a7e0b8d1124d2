//! What Redis holds of a lock, read without a script: the views `LockManager::Admin` shows (a
//! lock's holders, its queued waiters, how many jobs are parked on it), and the pipelines that
//! read them for many keys at once.

use redis::{FromRedisValue, RedisError, RedisResult, Value};

use crate::keys::LockKeys;
use crate::lock_core::LockCore;
use crate::token;

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
    /// How many jobs are parked on it (`parking.rs`).
    pub parked: u64,
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

/// A key to read: the key without its prefix, the Redis keys of its lock, and its parked jobs'.
pub(super) struct Target {
    pub(super) key: Vec<u8>,
    pub(super) keys: LockKeys,
    parked: Vec<u8>,
}

impl Target {
    pub(super) fn new(core: &LockCore, key: &[u8]) -> Self {
        Target {
            key: key.to_vec(),
            keys: core.keys().lock_keys(key),
            parked: core.keys().parked(key),
        }
    }
}

/// What reading one key found.
pub(super) enum Read {
    Lock(LockView),
    /// Neither holder nor live waiter nor parked job, or a key that is no lock (another type).
    Absent,
    /// Its node refused the key (MOVED while a slot migrates): read again on its own.
    Failed(RedisError),
}

/// Reads `targets`, all served by the node of `conn`, in two pipelines at most (the second only
/// for semaphores and queues). Replies are read one at a time, as `scripts::acquire` reads its two.
pub(super) fn read_locks(
    conn: &mut redis::Connection,
    targets: &[Target],
) -> RedisResult<Vec<Read>> {
    let (now_ms, shapes) = read_shapes(conn, targets)?;
    ask_details(conn, targets, shapes.iter().map(|(shape, _)| shape))?;
    targets
        .iter()
        .zip(shapes)
        .map(|(target, (shape, parked))| read_of(conn, target, shape, parked, now_ms))
        .collect()
}

/// The first pipeline: `TIME` (Redis's clock, in ms) and, per key, `GET` (its holder's token, or
/// WRONGTYPE for a semaphore), `PTTL`, its queue and `LLEN` of its parked jobs (their number).
fn read_shapes(
    conn: &mut redis::Connection,
    targets: &[Target],
) -> RedisResult<(u64, Vec<(Shape, u64)>)> {
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
        first.cmd("LLEN").arg(&target.parked);
    }
    conn.send_packed_command(&first.get_packed_pipeline())?;
    let now_ms = redis_ms(conn.recv_response()?.extract_error()?)?;
    let mut shapes = Vec::with_capacity(targets.len());
    for _ in targets {
        let holder = conn.recv_response()?;
        let pttl = conn.recv_response()?;
        let queue = conn.recv_response()?;
        // Not a list (WRONGTYPE): no job of ours is parked there.
        let parked = match conn.recv_response()? {
            Value::Int(count) => u64::try_from(count).unwrap_or(0),
            _ => 0,
        };
        shapes.push((Shape::of(holder, pttl, queue), parked));
    }
    Ok((now_ms, shapes))
}

/// The second pipeline, sent only when a key needs it: a semaphore's holders, a queue's waiters'
/// details. `read_of` reads their replies, key by key, in the order they were asked.
fn ask_details<'a>(
    conn: &mut redis::Connection,
    targets: &[Target],
    shapes: impl Iterator<Item = &'a Shape>,
) -> RedisResult<()> {
    let mut second = redis::pipe();
    let mut asked = 0;
    for (target, shape) in targets.iter().zip(shapes) {
        if let Shape::Other {
            semaphore: true, ..
        } = shape
        {
            second
                .cmd("ZRANGE")
                .arg(&target.keys.lock)
                .arg(0)
                .arg(-1)
                .arg("WITHSCORES");
            asked += 1;
        }
        if let Shape::Plain { queue, .. } | Shape::Other { queue, .. } = shape {
            if !queue.is_empty() {
                second.cmd("HMGET").arg(&target.keys.waiters);
                for (token, _) in queue {
                    second.arg(token);
                }
                asked += 1;
            }
        }
    }
    if asked > 0 {
        conn.send_packed_command(&second.get_packed_pipeline())?;
    }
    Ok(())
}

/// One key's read: its shape, and the replies `ask_details` asked for it.
fn read_of(
    conn: &mut redis::Connection,
    target: &Target,
    shape: Shape,
    parked: u64,
    now_ms: u64,
) -> RedisResult<Read> {
    let (semaphore, holders, queue) = match shape {
        Shape::Failed(error) => return Ok(Read::Failed(error)),
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
    // Parked jobs with neither holder nor waiter: a lock that expired with no release (its
    // holder died), its line waiting for the fallback. Shown, for an operator to see it.
    Ok(if holders.is_empty() && waiters.is_empty() && parked == 0 {
        Read::Absent
    } else {
        Read::Lock(LockView {
            key: target.key.clone(),
            semaphore,
            holders,
            waiters,
            parked,
        })
    })
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
            parked: 0,
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
