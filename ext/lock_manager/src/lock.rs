//! The lock algorithm: SET NX PX with a unique token to acquire, a compare-and-delete that
//! hands the lock to the next queued waiter to release, and event-driven waiting.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use redis::{FromRedisValue, RedisError, Value};

use crate::error::LockError;
use crate::gvl::Interrupt;
use crate::pool::{is_signalled, Pool, PoolSettings, STRAY_SIGNAL_RETRIES};
use crate::scripts::{
    self, Acquired, ACQUIRE, ACQUIRE_SHARED, LEAVE, REFRESH, REFRESH_SHARED, RELEASE,
    RELEASE_SHARED, WAIT,
};
use crate::subscriber::Subscriber;
use crate::wait::{next_pause, Backoff, HEARTBEAT, HEARTBEAT_MS};

/// A lock handed over by a release is taken on the word of the release's message only while
/// the attempt that queued its waiter was sent less than this share of the hand-off's TTL ago:
/// the lock then stays valid for at least the rest. Otherwise the waiter confirms with a round
/// trip, which also resets the TTL.
const TRUSTED_SHARE_OF_HANDOFF: u32 = 2;

pub struct LockSettings {
    pub pool: PoolSettings,
    pub key_prefix: Vec<u8>,
    pub retry_interval: Duration,
}

/// One acquisition: who (token), what (key, without the prefix), for how long, shared by how
/// many holders (1: the plain lock), and whether waiters queue in arrival order.
pub struct Claim<'a> {
    pub key: &'a [u8],
    pub token: &'a str,
    pub ttl_ms: u64,
    pub limit: u32,
    pub fair: bool,
}

pub struct LockCore {
    pool: Pool,
    subscriber: Subscriber,
    key_prefix: Vec<u8>,
    /// The fencing counter's full key (built once: every acquire names it).
    fencing_counter: Vec<u8>,
    /// Whether the Redis user may run our scripts, shown by one that ran. Until then acquires go
    /// through the ACQUIRE script, not the scriptless pipeline: a user who could take a lock but
    /// never release it is refused before it takes anything.
    scripts_allowed: AtomicBool,
    retry_interval: Duration,
}

/// The fencing counter's name, after the key prefix: reserved, like the ":queue" and
/// ":waiters" suffixes.
const FENCING_COUNTER: &[u8] = b"lock_manager:fencing_token";

/// A fencing token: a number, issued with each acquisition, that only grows for a key.
pub type FencingToken = u64;

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

/// The Redis keys of one plain lock: the lock, its queue of waiters, and their details; and the
/// fencing counter.
struct LockKeys {
    lock: Vec<u8>,
    queue: Vec<u8>,
    waiters: Vec<u8>,
    fencing: Vec<u8>,
}

impl LockKeys {
    /// KEYS of the plain-lock scripts.
    fn all(&self) -> [&[u8]; 4] {
        [&self.lock, &self.queue, &self.waiters, &self.fencing]
    }
}

/// What undoes a command whose reply was cut short (an interrupt, a timeout), since it may
/// still run: it writes the undo on the same connection (see `LuaScript::send_after`).
type Undo<'a> = &'a dyn Fn(&mut redis::Connection);

/// What one attempt found.
enum Attempt {
    Acquired(FencingToken),
    /// Held by others; `retry_in` is when it expires on its own, when Redis said.
    Held {
        retry_in: Option<Duration>,
    },
}

/// Why a round trip failed, as far as the connection is concerned.
enum Failure {
    /// The connection died (reset, EOF, broken pipe): a fresh one may well work.
    Dropped(RedisError),
    /// A signal that was not for us (SIGCHLD from any child process, say: Ruby's handlers do
    /// not restart system calls) cut a command that is safe to repeat short: worth retrying on a
    /// fresh connection.
    Signalled(RedisError),
    /// Ruby interrupted the thread mid-command.
    Interrupted,
    /// No usable answer: timeout, garbled reply. Whether the command ran is unknown.
    Unusable(RedisError),
    /// Redis answered with an error reply; the connection itself is fine.
    Refused(RedisError),
}

impl LockCore {
    pub fn new(settings: LockSettings) -> Result<LockCore, LockError> {
        let pool = Pool::new(settings.pool)?;
        let subscriber = Subscriber::new(
            pool.client().clone(),
            &settings.key_prefix,
            pool.settings().connect_timeout,
        );
        Ok(LockCore {
            pool,
            subscriber,
            fencing_counter: [settings.key_prefix.as_slice(), FENCING_COUNTER].concat(),
            scripts_allowed: AtomicBool::new(false),
            key_prefix: settings.key_prefix,
            retry_interval: settings.retry_interval,
        })
    }

    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    pub fn redis_key(&self, key: &[u8]) -> Vec<u8> {
        [self.key_prefix.as_slice(), key].concat()
    }

    fn keys(&self, key: &[u8]) -> LockKeys {
        let lock = self.redis_key(key);
        LockKeys {
            queue: [lock.as_slice(), b":queue"].concat(),
            waiters: [lock.as_slice(), b":waiters"].concat(),
            fencing: self.fencing_counter.clone(),
            lock,
        }
    }

    /// One attempt, one round trip: the fencing token when `claim.token` now holds the lock,
    /// `None` when another does. Does not queue.
    pub fn try_acquire(
        &self,
        claim: &Claim,
        interrupt: &Interrupt,
    ) -> Result<Option<FencingToken>, LockError> {
        if claim.limit > 1 {
            return self
                .attempt_shared(claim, interrupt)
                .map(|attempt| match attempt {
                    Attempt::Acquired(fencing_token) => Some(fencing_token),
                    Attempt::Held { .. } => None,
                });
        }
        let redis_key = self.redis_key(claim.key);
        let ttl = claim.ttl_ms.to_string();
        let release_args: [&[u8]; 2] = [claim.token.as_bytes(), HEARTBEAT_MS.as_bytes()];
        let undo = |conn: &mut redis::Connection| {
            RELEASE.send_after(conn, &self.keys(claim.key).all(), &release_args);
        };
        let scripts_allowed = self.scripts_allowed.load(Ordering::Acquire);
        // Re-sent after a dropped connection, it succeeds if the first one took the lock.
        self.round_trip(interrupt, Some(&undo), |conn, attempt| {
            if !scripts_allowed {
                let keys: [&[u8]; 2] = [&redis_key, &self.fencing_counter];
                let fencing_token =
                    ACQUIRE.run::<u64>(conn, &keys, &[claim.token.as_bytes(), ttl.as_bytes()])?;
                self.scripts_allowed.store(true, Ordering::Release);
                return Ok((fencing_token > 0).then_some(fencing_token));
            }
            let acquired = scripts::acquire(
                conn,
                &redis_key,
                &self.fencing_counter,
                claim.token,
                &ttl,
                attempt > 0,
            )?;
            match acquired {
                Acquired::Taken(fencing_token) => Ok(Some(fencing_token)),
                Acquired::Held => Ok(None),
                Acquired::Unfenced(refusal) => {
                    // A lock without a fencing token is not handed out: release it, then say why.
                    let keys = self.keys(claim.key);
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
        let keys = self.keys(claim.key);
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
            let taken_at_once = if claim.limit > 1 || claim.fair || queued_attempts > 0 {
                None
            } else {
                self.try_acquire(claim, interrupt)?
            };
            let attempt = if let Some(fencing_token) = taken_at_once {
                Attempt::Acquired(fencing_token)
            } else if claim.limit > 1 {
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
        let ttl = claim.ttl_ms.to_string();
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
        let ttl = claim.ttl_ms.to_string();
        let limit = claim.limit.to_string();
        let args: [&[u8]; 3] = [claim.token.as_bytes(), ttl.as_bytes(), limit.as_bytes()];
        let undo = |conn: &mut redis::Connection| {
            RELEASE_SHARED.send_after(conn, &[&redis_key], &[claim.token.as_bytes()]);
        };
        let reply = self.round_trip(interrupt, Some(&undo), |conn, _| {
            ACQUIRE_SHARED.run::<Vec<i64>>(conn, &[&redis_key, &self.fencing_counter], &args)
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
        let keys = self.keys(key);
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
            let failure = classify(error, interrupt, undo.is_some());
            conn.poisoned = !matches!(failure, Failure::Refused(_));
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
/// process) said it was handed to `claim.token`, and it is known to stay valid long enough: the
/// hand-off came after `queued_at`, when the attempt that queued us was sent, and the release
/// gave it the hand-off's TTL (or the claim's, if shorter). `None`: not handed over, or too long
/// ago to tell; an attempt will confirm.
fn handed_over(claim: &Claim, queued_at: Instant, interrupt: &Interrupt) -> Option<Acquisition> {
    let fencing_token = interrupt.waker().take_handed()?;
    let ttl = Duration::from_millis(claim.ttl_ms);
    let handoff_ttl = ttl.min(HEARTBEAT);
    if queued_at.elapsed() >= handoff_ttl / TRUSTED_SHARE_OF_HANDOFF {
        return None;
    }
    Some(Acquisition {
        fencing_token,
        expires_early: (handoff_ttl < ttl).then_some(queued_at + handoff_ttl),
    })
}

/// An error reply, by its code: each kind the caller can act on has its own error.
fn refusal(addr: &str, error: &RedisError) -> LockError {
    let (addr, reply) = (addr.to_owned(), error.to_string());
    match error.code() {
        Some("NOPERM") => LockError::Permission { addr, reply },
        // An ACL refusal inside a script comes back as ERR.
        _ if reply.contains("The user executing the script can't") => {
            LockError::Permission { addr, reply }
        }
        Some("OOM") => LockError::OutOfMemory { addr, reply },
        Some("WRONGPASS" | "NOAUTH") => LockError::Authentication { addr, cause: reply },
        _ => LockError::Server { addr, reply },
    }
}

/// `{1, fencing token}` acquired; `{0, ms}` held, expiring on its own in `ms` (negative: unknown).
fn attempt_from(reply: &[i64]) -> Attempt {
    match reply {
        [1, fencing_token, ..] => Attempt::Acquired(*fencing_token as FencingToken),
        [_, ms, ..] if *ms >= 0 => Attempt::Held {
            retry_in: Some(Duration::from_millis(*ms as u64 + 1)),
        },
        _ => Attempt::Held { retry_in: None },
    }
}

/// `undoable`: the command has an undo (an acquire). Cut short by any signal, it is undone and
/// handed back to Ruby, which resumes it with a new token: retried with the same token on another
/// connection, it could be overtaken by its own late undo.
fn classify(error: RedisError, interrupt: &Interrupt, undoable: bool) -> Failure {
    let signalled = is_signalled(&error);
    if signalled && (undoable || interrupt.takes_signals_to_ruby()) {
        Failure::Interrupted
    } else if signalled {
        Failure::Signalled(error)
    } else if error.is_timeout() {
        Failure::Unusable(error)
    } else if error.is_connection_dropped() {
        Failure::Dropped(error)
    } else if error.is_io_error() || error.kind() == redis::ErrorKind::Parse {
        Failure::Unusable(error)
    } else {
        Failure::Refused(error)
    }
}
