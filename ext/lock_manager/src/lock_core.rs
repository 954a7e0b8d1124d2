//! The lock algorithm: SET NX PX with a unique token to acquire, a compare-and-delete that
//! hands the lock to the next queued waiter to release, and event-driven waiting.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use redis::{FromRedisValue, RedisError, Value};

use crate::error::LockError;
use crate::gvl::Interrupt;
use crate::keys::{KeySpace, LockKeys};
use crate::pool::{Pool, PoolSettings, STRAY_SIGNAL_RETRIES};
use crate::replies::{attempt_from, classify, refusal, Attempt, Failure, FencingToken};
use crate::request::Request;
use crate::scripts::{
    self, Acquired, ACQUIRE, ACQUIRE_SHARED, LEAVE, REFRESH, REFRESH_SHARED, RELEASE,
    RELEASE_SHARED, WAIT,
};
use crate::subscriber::Subscriber;
use crate::wait::{judge_handoff, next_pause, Backoff, HandedOver, HEARTBEAT_MS};

pub struct LockSettings {
    pub pool: PoolSettings,
    pub key_prefix: Vec<u8>,
    pub retry_interval: Duration,
}

/// One acquisition: who (token), what (key, without the prefix), and what the call asks for.
pub struct Claim<'a> {
    pub key: &'a [u8],
    pub token: &'a str,
    pub request: Request,
}

pub struct LockCore {
    pool: Pool,
    subscriber: Subscriber,
    keys: KeySpace,
    /// Whether the Redis user may run our scripts, shown by one that ran. Until then acquires go
    /// through the ACQUIRE script, not the scriptless pipeline: a user who could take a lock but
    /// never release it is refused before it takes anything.
    scripts_allowed: AtomicBool,
    retry_interval: Duration,
}

/// A lock taken by `acquire_until`.
#[derive(Debug)]
pub struct Acquisition {
    pub fencing_token: FencingToken,
    /// Set when a release handed the lock over with the hand-off's TTL, shorter than the
    /// claim's: the lock lasts until this instant at least, and must be extended before it
    /// (see `renewal.rs`).
    pub expires_early: Option<Instant>,
}

impl Acquisition {
    /// A lock taken with the claim's own TTL.
    pub fn for_claimed_ttl(fencing_token: FencingToken) -> Self {
        Acquisition {
            fencing_token,
            expires_early: None,
        }
    }
}

/// What undoes a command whose reply was cut short (an interrupt, a timeout), since it may
/// still run: it writes the undo on the same connection (see `LuaScript::send_after`).
type Undo<'a> = &'a dyn Fn(&mut redis::Connection);

impl LockCore {
    pub fn new(settings: LockSettings) -> Result<LockCore, LockError> {
        let pool = Pool::new(settings.pool)?;
        let keys = KeySpace::new(&settings.key_prefix);
        let subscriber = Subscriber::new(
            pool.client().clone(),
            &keys,
            pool.settings().connect_timeout,
        );
        Ok(LockCore {
            pool,
            subscriber,
            keys,
            scripts_allowed: AtomicBool::new(false),
            retry_interval: settings.retry_interval,
        })
    }

    pub fn pool(&self) -> &Pool {
        &self.pool
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
                    Attempt::Held { .. } => None,
                });
        }
        let redis_key = self.redis_key(claim.key);
        let ttl = claim.request.ttl_ms.to_string();
        let release_args: [&[u8]; 2] = [claim.token.as_bytes(), HEARTBEAT_MS.as_bytes()];
        let undo = |conn: &mut redis::Connection| {
            RELEASE.send_after(conn, &self.keys.lock_keys(claim.key).all(), &release_args);
        };
        let scripts_allowed = self.scripts_allowed.load(Ordering::Acquire);
        // Re-sent after a dropped connection, it succeeds if the first one took the lock.
        self.round_trip(interrupt, Some(&undo), |conn, attempt| {
            if !scripts_allowed {
                let keys: [&[u8]; 2] = [&redis_key, self.keys.fencing_counter()];
                let fencing_token =
                    ACQUIRE.run::<u64>(conn, &keys, &[claim.token.as_bytes(), ttl.as_bytes()])?;
                self.scripts_allowed.store(true, Ordering::Release);
                return Ok((fencing_token > 0).then_some(fencing_token));
            }
            let acquired = scripts::acquire(
                conn,
                &redis_key,
                self.keys.fencing_counter(),
                claim.token,
                &ttl,
                attempt > 0,
            )?;
            match acquired {
                Acquired::Taken(fencing_token) => Ok(Some(fencing_token)),
                Acquired::Held => Ok(None),
                Acquired::Unfenced(refusal) => {
                    // A lock without a fencing token is not handed out: release it, then say why.
                    let keys = self.keys.lock_keys(claim.key);
                    RELEASE.run::<Value>(conn, &keys.all(), &release_args)?;
                    Err(refusal)
                }
            }
        })
    }

    /// Waits until `claim.token` holds the lock or `deadline` passes. Woken by releases
    /// (published by whoever releases, in any process), by the holder's TTL running out, or
    /// after a backoff when releases cannot reach us. `started` is when the caller began waiting.
    pub fn acquire_until(
        &self,
        claim: &Claim,
        started: Instant,
        deadline: Instant,
        interrupt: &Interrupt,
    ) -> Result<Acquisition, LockError> {
        let keys = self.keys.lock_keys(claim.key);
        let _registration = self
            .subscriber
            .register(&keys.lock, claim.token, interrupt.waker());
        // A hand-over to an earlier acquisition on the same interrupt (its release's reply and its
        // publication both tell) is not news for this one.
        interrupt.waker().take_handed();
        let mut backoff = Backoff::new(self.retry_interval);
        let mut queued_attempts = 0u32;
        // When the last attempt that left us queued was sent: a hand-off came after it.
        let mut queued_at = None;
        let outcome = (|| loop {
            if let Some(handed) = queued_at.and_then(|at| handed_over(claim, at, interrupt)) {
                return Ok(handed);
            }
            let request = &claim.request;
            let taken_at_once = if request.is_shared() || request.fair || queued_attempts > 0 {
                None
            } else {
                self.try_acquire(claim, interrupt)?
            };
            let attempt = if let Some(fencing_token) = taken_at_once {
                Attempt::Acquired(fencing_token)
            } else if request.is_shared() {
                self.attempt_shared(claim, interrupt)?
            } else {
                // Waiters queue: a release hands the lock to the first of them, so a thread that
                // releases and re-acquires in a loop cannot starve them. A fair waiter queues
                // without trying first, so it never takes a free lock ahead of the queue.
                queued_attempts += 1;
                let sent = Instant::now();
                let attempt = self.attempt_queued(claim, &keys, interrupt)?;
                queued_at = Some(sent);
                attempt
            };
            let retry_in = match attempt {
                Attempt::Acquired(fencing_token) => {
                    return Ok(Acquisition::for_claimed_ttl(fencing_token))
                }
                Attempt::Held { retry_in } => retry_in,
            };
            let now = Instant::now();
            if now >= deadline {
                return Err(LockError::NotAcquired {
                    waited: now - started,
                });
            }
            let pause = next_pause(self.subscriber.is_listening(), retry_in, &mut backoff);
            interrupt.sleep_until((now + pause).min(deadline))?;
        })();
        if outcome.is_err() && queued_attempts > 0 {
            // Leave the queue (and pass on a lock handed to us meanwhile), whatever happened.
            let _ = self.leave(&keys, claim.token);
        }
        outcome
    }

    fn attempt_queued(
        &self,
        claim: &Claim,
        keys: &LockKeys,
        interrupt: &Interrupt,
    ) -> Result<Attempt, LockError> {
        let ttl = claim.request.ttl_ms.to_string();
        let heartbeat = HEARTBEAT_MS.as_bytes();
        let channel = self.subscriber.own_channel();
        let args: [&[u8]; 4] = [
            claim.token.as_bytes(),
            ttl.as_bytes(),
            heartbeat,
            channel.as_deref().unwrap_or_default(),
        ];
        let undo = |conn: &mut redis::Connection| {
            LEAVE.send_after(conn, &keys.all(), &[claim.token.as_bytes(), heartbeat]);
        };
        let reply = self.round_trip(interrupt, Some(&undo), |conn, _| {
            WAIT.run::<Vec<i64>>(conn, &keys.all(), &args)
        })?;
        Ok(attempt_from(&reply))
    }

    fn attempt_shared(&self, claim: &Claim, interrupt: &Interrupt) -> Result<Attempt, LockError> {
        let redis_key = self.redis_key(claim.key);
        let ttl = claim.request.ttl_ms.to_string();
        let limit = claim.request.limit.to_string();
        let args: [&[u8]; 3] = [claim.token.as_bytes(), ttl.as_bytes(), limit.as_bytes()];
        let undo = |conn: &mut redis::Connection| {
            RELEASE_SHARED.send_after(conn, &[&redis_key], &[claim.token.as_bytes()]);
        };
        let reply = self.round_trip(interrupt, Some(&undo), |conn, _| {
            ACQUIRE_SHARED.run::<Vec<i64>>(conn, &[&redis_key, self.keys.fencing_counter()], &args)
        })?;
        Ok(attempt_from(&reply))
    }

    /// Leaves the queue of `keys` for good, to completion (even while Ruby interrupts us).
    fn leave(&self, keys: &LockKeys, token: &str) -> Result<(), LockError> {
        let args: [&[u8]; 2] = [token.as_bytes(), HEARTBEAT_MS.as_bytes()];
        self.round_trip(&Interrupt::for_current_thread(), None, |conn, _| {
            LEAVE.run::<Value>(conn, &keys.all(), &args)
        })
        .map(|_| ())
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
        self.round_trip(interrupt, None, |conn, _| {
            if limit > 1 {
                return RELEASE_SHARED
                    .run::<i64>(conn, &[&keys.lock], &[token.as_bytes()])
                    .map(|released| released == 1);
            }
            let args: [&[u8]; 2] = [token.as_bytes(), HEARTBEAT_MS.as_bytes()];
            match RELEASE.run::<Value>(conn, &keys.all(), &args)? {
                Value::Int(released) => Ok(released == 1),
                handed => {
                    let message = Vec::<u8>::from_redis_value(handed)?;
                    self.subscriber.handed_over_here(&keys.lock, &message);
                    Ok(true)
                }
            }
        })
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
        self.round_trip(interrupt, None, |conn, _| {
            script
                .run::<i64>(conn, &[&redis_key], &[token.as_bytes(), ttl.as_bytes()])
                .map(|renewed| renewed == 1)
        })
    }

    /// Whether `token` holds the lock right now.
    pub fn owned(&self, key: &[u8], token: &str, interrupt: &Interrupt) -> Result<bool, LockError> {
        let redis_key = self.redis_key(key);
        self.round_trip(interrupt, None, |conn, _| {
            redis::cmd("GET")
                .arg(&redis_key)
                .query::<Option<Vec<u8>>>(conn)
                .map(|holder| holder.as_deref() == Some(token.as_bytes()))
        })
    }

    /// Whether anyone holds the lock right now.
    pub fn locked(&self, key: &[u8], interrupt: &Interrupt) -> Result<bool, LockError> {
        let redis_key = self.redis_key(key);
        self.round_trip(interrupt, None, |conn, _| {
            redis::cmd("EXISTS")
                .arg(&redis_key)
                .query::<i64>(conn)
                .map(|n| n == 1)
        })
    }

    /// Runs `command` on a pooled connection. After a dropped connection it retries once on
    /// another, and keeps retrying while it only meets pooled connections that went stale
    /// (Redis restarted since they were last used), at most once per pooled connection. When
    /// the reply was cut short (interrupt, timeout) the command may still run: `undo` is then
    /// sent on the same connection, so that Redis runs it after the command, never before.
    fn round_trip<T>(
        &self,
        interrupt: &Interrupt,
        undo: Option<Undo>,
        mut command: impl FnMut(&mut redis::Connection, u32) -> Result<T, RedisError>,
    ) -> Result<T, LockError> {
        let retry_limit = self.pool.settings().pool_size + 1;
        let mut attempt = 0;
        let mut stray_signals = 0;
        loop {
            let mut conn = self.pool.checkout(interrupt)?;
            interrupt.check()?;
            let error = match command(&mut conn.redis, attempt) {
                Ok(value) => {
                    conn.reused = true;
                    return Ok(value);
                }
                Err(error) => error,
            };
            let failure = classify(error, undo.is_some(), interrupt.takes_signals_to_ruby());
            conn.poisoned = !failure.keeps_connection();
            if let (Failure::Interrupted | Failure::Unusable(_), Some(undo)) = (&failure, undo) {
                undo(&mut conn.redis);
            }
            match failure {
                Failure::Dropped(_) if attempt == 0 || (conn.reused && attempt < retry_limit) => {
                    attempt += 1;
                }
                Failure::Signalled(_) if stray_signals < STRAY_SIGNAL_RETRIES => {
                    stray_signals += 1;
                    attempt += 1;
                }
                Failure::Dropped(error) | Failure::Signalled(error) | Failure::Unusable(error) => {
                    return Err(self.connection_error(&error));
                }
                Failure::Interrupted => return Err(LockError::Interrupted),
                Failure::Refused(error) => return Err(refusal(self.pool.addr(), &error)),
            }
        }
    }

    fn connection_error(&self, error: &RedisError) -> LockError {
        if !error.is_timeout() {
            return LockError::connection(self.pool.addr(), error);
        }
        LockError::Connection {
            addr: self.pool.addr().to_owned(),
            cause: format!(
                "no reply within read_timeout ({:.3}s)",
                self.pool.settings().read_timeout.as_secs_f64()
            ),
            timed_out: true,
        }
    }
}

/// The lock, when a release's message (through the subscriber, or the reply to a release by this
/// process) said it was handed to `claim.token` after `queued_at`, when the attempt that queued
/// us was sent, and that is recent enough to trust (`wait::judge_handoff`). `None`: not handed
/// over, or too long ago to tell; an attempt will confirm.
fn handed_over(claim: &Claim, queued_at: Instant, interrupt: &Interrupt) -> Option<Acquisition> {
    let fencing_token = interrupt.waker().take_handed()?;
    match judge_handoff(claim.request.ttl(), queued_at.elapsed()) {
        HandedOver::Confirm => None,
        HandedOver::Trusted { expires_early } => Some(Acquisition {
            fencing_token,
            expires_early: expires_early.map(|after| queued_at + after),
        }),
    }
}
