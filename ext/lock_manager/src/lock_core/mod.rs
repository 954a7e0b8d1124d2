//! The lock algorithm: SET NX PX with a unique token to acquire, a compare-and-delete that
//! hands the lock to the next queued waiter to release, and event-driven waiting (`waiting.rs`).
//! Each operation says what to run and what each reply means; how it reaches Redis, and what a
//! failure on the way becomes, is `transport.rs`'s.

mod waiting;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use redis::{FromRedisValue, RedisError, Value};

use crate::error::{LockError, Written};
use crate::gvl::Interrupt;
use crate::held::HeldLocks;
use crate::keys::{KeySpace, LockKeys};
use crate::pool::PoolSettings;
use crate::replies::{attempt_from, Attempt, FencingToken};
use crate::request::Request;
use crate::router::Router;
use crate::scripts::{
    self, Acquired, LuaScript, ScriptCall, ACQUIRE, ACQUIRE_SHARED, REFRESH, REFRESH_SHARED,
    RELEASE, RELEASE_SHARED,
};
use crate::subscriber::Subscriber;
use crate::transport::Undo;
use crate::wait::HEARTBEAT_MS;

pub struct LockSettings {
    pub pool: PoolSettings,
    pub key_prefix: Vec<u8>,
    pub retry_interval: Duration,
    /// Replicas that must acknowledge an acquisition before it counts (`WAIT`), if any.
    pub replication: Option<Replication>,
}

/// `min_replicas` and `replica_timeout`.
#[derive(Clone, Copy, Debug)]
pub struct Replication {
    pub replicas: u32,
    pub timeout: Duration,
}

/// One acquisition: who (token), what (key, without the prefix), and what the call asks for.
pub struct Claim<'a> {
    pub key: &'a [u8],
    pub token: &'a str,
    pub request: Request,
}

pub struct LockCore {
    router: Router,
    replication: Option<Replication>,
    subscriber: Subscriber,
    keys: KeySpace,
    /// Whether the Redis user may run our scripts, shown by one that ran. Until then acquires go
    /// through the ACQUIRE script, not the scriptless pipeline: a user who could take a lock but
    /// never release it is refused before it takes anything.
    scripts_allowed: AtomicBool,
    retry_interval: Duration,
    /// The plain locks each thread of this process holds through this core.
    held: HeldLocks,
}

/// A lock taken by `acquire_until`.
#[derive(Debug)]
pub struct Acquisition {
    pub fencing_token: FencingToken,
    /// The token that holds the lock when it is not the claim's: a wait whose attempt was cut
    /// short (and undone) goes on with a fresh one, so that the late undo cannot release it.
    pub new_token: Option<String>,
    /// An attempt of this acquisition found the lock held by another (or, `fair`, queued behind
    /// another waiter): it was not taken at the first attempt. Known from the replies alone.
    pub contended: bool,
}

impl Acquisition {
    /// A lock taken with the claim's own token and TTL.
    pub fn for_claimed_ttl(fencing_token: FencingToken) -> Self {
        Acquisition {
            fencing_token,
            new_token: None,
            contended: false,
        }
    }
}

impl LockCore {
    pub fn new(settings: LockSettings) -> Result<LockCore, LockError> {
        let keys = KeySpace::new(&settings.key_prefix).map_err(LockError::Argument)?;
        let router = Router::new(settings.pool)?;
        let subscriber = Subscriber::new(
            router.listening_connector(),
            &keys,
            router.settings().connect_timeout,
        );
        Ok(LockCore {
            router,
            replication: settings.replication.filter(|r| r.replicas > 0),
            subscriber,
            keys,
            scripts_allowed: AtomicBool::new(false),
            retry_interval: settings.retry_interval,
            held: HeldLocks::new(),
        })
    }

    /// The pools (one, or one per Cluster node), and the round trips through them.
    pub fn pool(&self) -> &Router {
        &self.router
    }

    /// The plain locks this process's threads hold through this core.
    pub fn held(&self) -> &HeldLocks {
        &self.held
    }

    pub fn keys(&self) -> &KeySpace {
        &self.keys
    }

    pub fn redis_key(&self, key: &[u8]) -> Vec<u8> {
        self.keys.lock(key)
    }

    /// One attempt, one round trip: the fencing token when `claim.token` now holds the lock,
    /// `None` when another does. Does not queue.
    pub fn try_acquire(
        &self,
        claim: &Claim,
        interrupt: &Interrupt,
    ) -> Result<Option<FencingToken>, LockError> {
        if claim.request.is_shared() {
            return self
                .attempt_shared(claim, interrupt)
                .map(|attempt| match attempt {
                    Attempt::Acquired(fencing_token) => Some(fencing_token),
                    Attempt::Held { .. } | Attempt::NotQueued => None,
                });
        }
        let (taken, acknowledged) = self.acquire_plain(claim, interrupt)?;
        if taken.is_some() {
            self.check_replicated(claim, acknowledged)?;
        }
        Ok(taken)
    }

    /// `try_acquire` of a plain lock, and how many replicas acknowledged it (with
    /// `min_replicas`).
    fn acquire_plain(
        &self,
        claim: &Claim,
        interrupt: &Interrupt,
    ) -> Result<(Option<FencingToken>, Option<u32>), LockError> {
        let redis_key = self.redis_key(claim.key);
        let counter = KeySpace::fencing_counter(&redis_key);
        let mut digits = itoa::Buffer::new(); // not `to_string`: the formatting machinery costs more
        let ttl = digits.format(claim.request.ttl_ms);
        let release_args: [&[u8]; 2] = [claim.token.as_bytes(), HEARTBEAT_MS.as_bytes()];
        let undo = |conn: &mut redis::Connection| {
            RELEASE.send_after(conn, &self.keys.lock_keys(claim.key).all(), &release_args);
        };
        let scripts_allowed = self.scripts_allowed.load(Ordering::Acquire);
        // Re-sent after a dropped connection, it succeeds if the first one took the lock.
        self.router
            .round_trip(&redis_key, interrupt, Some(&undo), |conn, attempt| {
                // A slot that is migrating: the pipeline's two commands could be served by two nodes.
                if !scripts_allowed || attempt.migrating {
                    let keys: [&[u8]; 2] = [&redis_key, &counter];
                    let fencing_token = ACQUIRE.run::<u64>(
                        conn,
                        &keys,
                        &[claim.token.as_bytes(), ttl.as_bytes()],
                    )?;
                    self.scripts_allowed.store(true, Ordering::Release);
                    let taken = (fencing_token > 0).then_some(fencing_token);
                    return Ok((taken, self.acknowledged_if(taken.is_some(), conn)?));
                }
                let acquired =
                    scripts::acquire(conn, &redis_key, &counter, claim.token, ttl, attempt.resent)?;
                match acquired {
                    Acquired::Taken(fencing_token) => {
                        Ok((Some(fencing_token), self.acknowledged_if(true, conn)?))
                    }
                    Acquired::Held => Ok((None, None)),
                    Acquired::Unfenced(refusal) => {
                        // A lock without a fencing token is not handed out: release it, then say why.
                        let keys = self.keys.lock_keys(claim.key);
                        RELEASE.run::<Value>(conn, &keys.all(), &release_args)?;
                        Err(refusal)
                    }
                }
            })
    }

    /// Runs a script of one attempt (`{1, fencing token}` when taken, see `attempt_from`) and,
    /// with `min_replicas`, has an acquisition acknowledged or undone.
    fn scripted_attempt(
        &self,
        claim: &Claim,
        keys: &LockKeys,
        script: &LuaScript,
        args: &[&[u8]],
        undo: Option<Undo>,
        interrupt: &Interrupt,
    ) -> Result<Attempt, LockError> {
        let (reply, acknowledged) =
            self.router
                .round_trip(&keys.lock, interrupt, undo, |conn, _| {
                    let reply = script.run::<Vec<i64>>(conn, &keys.all(), args)?;
                    let taken = matches!(attempt_from(&reply), Attempt::Acquired(_));
                    Ok((reply, self.acknowledged_if(taken, conn)?))
                })?;
        let attempt = attempt_from(&reply);
        if matches!(attempt, Attempt::Acquired(_)) {
            self.check_replicated(claim, acknowledged)?;
        }
        Ok(attempt)
    }

    fn attempt_shared(&self, claim: &Claim, interrupt: &Interrupt) -> Result<Attempt, LockError> {
        let keys = self.keys.lock_keys(claim.key);
        let ttl = claim.request.ttl_ms.to_string();
        let limit = claim.request.limit.to_string();
        let args: [&[u8]; 3] = [claim.token.as_bytes(), ttl.as_bytes(), limit.as_bytes()];
        let undo = |conn: &mut redis::Connection| {
            let release_args = [
                claim.token.as_bytes(),
                HEARTBEAT_MS.as_bytes(),
                limit.as_bytes(),
            ];
            RELEASE_SHARED.send_after(conn, &keys.all(), &release_args);
        };
        self.scripted_attempt(claim, &keys, &ACQUIRE_SHARED, &args, Some(&undo), interrupt)
    }

    /// With `min_replicas`, after `taken` an acquisition on `conn`: how many replicas
    /// acknowledged this connection's writes within `replica_timeout` (`WAIT`, on the same
    /// connection: it counts that connection's writes, and every earlier one).
    pub(crate) fn acknowledged_if(
        &self,
        taken: bool,
        conn: &mut redis::Connection,
    ) -> Result<Option<u32>, RedisError> {
        let Some(replication) = self.replication.filter(|_| taken) else {
            return Ok(None);
        };
        let reached: i64 = redis::cmd("WAIT")
            .arg(replication.replicas)
            .arg(replication.timeout.as_millis().max(1) as u64)
            .query(conn)?;
        Ok(Some(u32::try_from(reached).unwrap_or(0)))
    }

    /// Whether a write `acknowledged_if` waited for reached `min_replicas` (true when none was
    /// asked).
    pub(crate) fn replicated(&self, acknowledged: Option<u32>) -> bool {
        match (self.replication, acknowledged) {
            (Some(replication), Some(reached)) => reached >= replication.replicas,
            _ => true,
        }
    }

    /// An acquisition that fewer than `min_replicas` acknowledged does not count: it is released
    /// (to completion, even while Ruby interrupts us) and the caller told how many did.
    fn check_replicated(&self, claim: &Claim, acknowledged: Option<u32>) -> Result<(), LockError> {
        if acknowledged.is_none() {
            return Ok(()); // no min_replicas: nothing was asked, and no key is built on this path
        }
        let key = self.redis_key(claim.key);
        self.undone_unless_replicated(&key, acknowledged, |undo| {
            let _ = self.release(claim.key, claim.token, claim.request.limit, undo);
        })
    }

    /// With `min_replicas`, a write (`route`: its key) that fewer replicas acknowledged
    /// (`acknowledged_if`) is undone by `undo`, to completion even while Ruby interrupts us, and
    /// becomes `NotReplicated`, saying how many did; else `Ok`.
    pub(crate) fn undone_unless_replicated(
        &self,
        route: &[u8],
        acknowledged: Option<u32>,
        undo: impl FnOnce(&Interrupt),
    ) -> Result<(), LockError> {
        let (Some(replication), Some(reached)) = (self.replication, acknowledged) else {
            return Ok(());
        };
        if self.replicated(acknowledged) {
            return Ok(());
        }
        undo(&Interrupt::for_current_thread());
        Err(LockError::NotReplicated {
            addr: self
                .router
                .pool_for(route)
                .map(|p| p.addr())
                .unwrap_or_default(),
            needed: replication.replicas,
            reached,
            timeout: replication.timeout,
            write: Written::Lock,
        })
    }

    /// Releases the lock (or this holder's slot, for `limit` > 1) if `token` still holds it,
    /// handing it to the next queued waiter; false when it expired or changed hands.
    pub fn release(
        &self,
        key: &[u8],
        token: &str,
        limit: u32,
        interrupt: &Interrupt,
    ) -> Result<bool, LockError> {
        let keys = self.keys.lock_keys(key);
        let mut digits = itoa::Buffer::new();
        let limit = digits.format(limit);
        let (script, args_len) = if limit != "1" {
            (&*RELEASE_SHARED, 3)
        } else {
            (&*RELEASE, 2)
        };
        let args: [&[u8]; 3] = [token.as_bytes(), HEARTBEAT_MS.as_bytes(), limit.as_bytes()];
        self.router
            .round_trip(&keys.lock, interrupt, None, |conn, _| {
                let reply = script.run::<Value>(conn, &keys.all(), &args[..args_len])?;
                self.released(&keys.lock, reply)
            })
    }

    /// A release's reply handed the lock to a waiter: it may be one of this process's.
    pub(crate) fn handed_over_here(&self, lock: &[u8], message: &[u8]) {
        self.subscriber.handed_over_here(lock, message);
    }

    /// Releases each key its token holds, as `release` does one plain lock: the claims of
    /// pending jobs removed in bulk. One round trip on one Redis, one per key on a Cluster (its
    /// node's). Every release is sent; an error reply to one fails the call after all ran.
    pub fn release_all(
        &self,
        claims: &[(&[u8], &str)],
        interrupt: &Interrupt,
    ) -> Result<Vec<bool>, LockError> {
        if self.router.is_cluster() {
            return claims
                .iter()
                .map(|&(key, token)| self.release(key, token, 1, interrupt))
                .collect();
        }
        let Some(&(first, _)) = claims.first() else {
            return Ok(Vec::new());
        };
        let keys: Vec<LockKeys> = claims
            .iter()
            .map(|&(key, _)| self.keys.lock_keys(key))
            .collect();
        let calls: Vec<ScriptCall> = keys
            .iter()
            .zip(claims)
            .map(|(keys, &(_, token))| {
                let args = vec![token.as_bytes(), HEARTBEAT_MS.as_bytes()];
                (keys.all().to_vec(), args)
            })
            .collect();
        self.router
            .round_trip(&self.redis_key(first), interrupt, None, |conn, _| {
                RELEASE
                    .run_many(conn, &calls)?
                    .into_iter()
                    .zip(&keys)
                    .map(|(reply, keys)| self.released(&keys.lock, reply))
                    .collect()
            })
    }

    /// What a release's reply says: whether it released `lock`. A hand-off message is told to
    /// this process's own waiter at once, ahead of its publication.
    fn released(&self, lock: &[u8], reply: Value) -> Result<bool, RedisError> {
        match reply.extract_error()? {
            Value::Int(released) => Ok(released == 1),
            handed => {
                let message = Vec::<u8>::from_redis_value(handed)?;
                self.handed_over_here(lock, &message);
                Ok(true)
            }
        }
    }

    /// Resets the TTL to `ttl_ms` (of this holder's slot, for `limit` > 1) if `token` still
    /// holds the lock.
    pub fn refresh(
        &self,
        key: &[u8],
        token: &str,
        ttl_ms: u64,
        limit: u32,
        interrupt: &Interrupt,
    ) -> Result<bool, LockError> {
        let redis_key = self.redis_key(key);
        let ttl = ttl_ms.to_string();
        let script = if limit > 1 {
            &*REFRESH_SHARED
        } else {
            &*REFRESH
        };
        self.router
            .round_trip(&redis_key, interrupt, None, |conn, _| {
                script
                    .run::<i64>(conn, &[&redis_key], &[token.as_bytes(), ttl.as_bytes()])
                    .map(|renewed| renewed == 1)
            })
    }

    /// Whether `token` holds the lock right now.
    pub fn owned(&self, key: &[u8], token: &str, interrupt: &Interrupt) -> Result<bool, LockError> {
        let redis_key = self.redis_key(key);
        self.router
            .round_trip(&redis_key, interrupt, None, |conn, _| {
                redis::cmd("GET")
                    .arg(&redis_key)
                    .query::<Option<Vec<u8>>>(conn)
                    .map(|holder| holder.as_deref() == Some(token.as_bytes()))
            })
    }

    /// Whether anyone holds the lock right now.
    pub fn locked(&self, key: &[u8], interrupt: &Interrupt) -> Result<bool, LockError> {
        let redis_key = self.redis_key(key);
        self.router
            .round_trip(&redis_key, interrupt, None, |conn, _| {
                redis::cmd("EXISTS")
                    .arg(&redis_key)
                    .query::<i64>(conn)
                    .map(|n| n == 1)
            })
    }
}
