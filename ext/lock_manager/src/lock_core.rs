//! The lock algorithm: SET NX PX with a unique token to acquire, a compare-and-delete that
//! hands the lock to the next queued waiter to release, and event-driven waiting.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::thread::{self, ThreadId};
use std::time::{Duration, Instant};

use redis::{FromRedisValue, RedisError, Value};

use crate::error::LockError;
use crate::gvl::Interrupt;
use crate::keys::{KeySpace, LockKeys};
use crate::per_process::PerProcess;
use crate::pool::{PoolSettings, STRAY_SIGNAL_RETRIES};
use crate::replies::{
    attempt_from, classify, cluster_redirect, refusal, Attempt, Failure, FencingToken, Redirect,
};
use crate::request::Request;
use crate::router::Router;
use crate::scripts::{
    self, Acquired, LuaScript, ACQUIRE, ACQUIRE_SHARED, LEAVE, LEAVE_SHARED, REFRESH,
    REFRESH_SHARED, RELEASE, RELEASE_SHARED, WAIT, WAIT_SHARED,
};
use crate::subscriber::{Registration, Subscriber};
use crate::token;
use crate::wait::{handoff_is_short, next_pause, Backoff, HEARTBEAT_MS};

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

/// How often a round trip follows MOVED before it gives up (each one updates the slot map).
const MOVED_LIMIT: u32 = 5;
/// Pause before asking again a Cluster slot that is migrating (ASK, TRYAGAIN) or failing over.
const CLUSTER_RETRY_PAUSE: Duration = Duration::from_millis(20);

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
    held: PerProcess<Mutex<Vec<Held>>>,
}

/// A plain lock some thread holds: which thread, which key, until when it is valid unless
/// renewed or refreshed (`None`: renewed until released), and which acquisition it is (a thread
/// may keep an expired handle of the key beside the lock it holds now).
type Held = (ThreadId, Vec<u8>, Option<Instant>, HoldId);

/// One acquisition's entry in the registry of held locks.
pub type HoldId = u64;

static NEXT_HOLD: AtomicU64 = AtomicU64::new(0);

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

/// What undoes a command whose reply was cut short (an interrupt, a timeout), since it may
/// still run: it writes the undo on the same connection (see `LuaScript::send_after`).
pub(crate) type Undo<'a> = &'a dyn Fn(&mut redis::Connection);

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
            held: PerProcess::new(),
        })
    }

    /// The pools (one, or one per Cluster node).
    pub fn pool(&self) -> &Router {
        &self.router
    }

    /// Fails with `AlreadyHeld` when the calling thread holds the plain lock `key` through this
    /// core and it has not expired (see `hold`).
    pub fn check_not_held(&self, key: &[u8]) -> Result<(), LockError> {
        let (thread, now) = (thread::current().id(), Instant::now());
        let (held, _) = self.held.get_or_create(Mutex::default);
        let held = held.lock().unwrap_or_else(|e| e.into_inner());
        let valid = |until: &Option<Instant>| until.is_none_or(|until| until > now);
        match held
            .iter()
            .any(|(by, k, until, _)| *by == thread && k == key && valid(until))
        {
            true => Err(LockError::AlreadyHeld),
            false => Ok(()),
        }
    }

    /// Records that the calling thread holds the plain lock `key`, valid `until` (see `Held`),
    /// until `unhold`.
    pub fn hold(&self, key: &[u8], until: Option<Instant>) -> HoldId {
        let id = NEXT_HOLD.fetch_add(1, Ordering::Relaxed);
        let (held, _) = self.held.get_or_create(Mutex::default);
        let mut held = held.lock().unwrap_or_else(|e| e.into_inner());
        held.push((thread::current().id(), key.to_vec(), until, id));
        id
    }

    /// A refresh of the held lock `id`: valid `until`.
    pub fn held_until(&self, id: HoldId, until: Option<Instant>) {
        if let Some(held) = self.held.get() {
            let mut held = held.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(entry) = held.iter_mut().find(|entry| entry.3 == id) {
                entry.2 = until;
            }
        }
    }

    /// Forgets the `hold` `id` (in this process: a child's locks are its parent's).
    pub fn unhold(&self, id: HoldId) {
        if let Some(held) = self.held.get() {
            let mut held = held.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(at) = held.iter().position(|entry| entry.3 == id) {
                held.swap_remove(at);
            }
        }
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
        let ttl = claim.request.ttl_ms.to_string();
        let release_args: [&[u8]; 2] = [claim.token.as_bytes(), HEARTBEAT_MS.as_bytes()];
        let undo = |conn: &mut redis::Connection| {
            RELEASE.send_after(conn, &self.keys.lock_keys(claim.key).all(), &release_args);
        };
        let scripts_allowed = self.scripts_allowed.load(Ordering::Acquire);
        // Re-sent after a dropped connection, it succeeds if the first one took the lock.
        self.round_trip(&redis_key, interrupt, Some(&undo), |conn, attempt| {
            // A slot that is migrating: the pipeline's two commands could be served by two nodes.
            if !scripts_allowed || attempt.migrating {
                let keys: [&[u8]; 2] = [&redis_key, &counter];
                let fencing_token =
                    ACQUIRE.run::<u64>(conn, &keys, &[claim.token.as_bytes(), ttl.as_bytes()])?;
                self.scripts_allowed.store(true, Ordering::Release);
                let taken = (fencing_token > 0).then_some(fencing_token);
                return Ok((taken, self.acknowledged_if(taken.is_some(), conn)?));
            }
            let acquired = scripts::acquire(
                conn,
                &redis_key,
                &counter,
                claim.token,
                &ttl,
                attempt.resent,
            )?;
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

    /// Waits until the claim holds the lock or `deadline` passes. Woken by releases (published
    /// by whoever releases, in any process), by the holder's TTL running out, or after a backoff
    /// when releases cannot reach us. `started` is when the caller began waiting. Redis being
    /// unreachable, slow or refusing for a while (`LockError::is_transient`) does not end the
    /// wait: it goes on with backoff, and at the deadline the last such error is returned
    /// rather than `NotAcquired`.
    pub fn acquire_until(
        &self,
        claim: &Claim,
        started: Instant,
        deadline: Instant,
        interrupt: &Interrupt,
    ) -> Result<Acquisition, LockError> {
        let keys = self.keys.lock_keys(claim.key);
        let mut waiter = Waiter {
            token: claim.token.to_owned(),
            registration: self
                .subscriber
                .register(&keys.lock, claim.token, interrupt.waker()),
            queued_attempts: 0,
            queued: false,
            queued_at: None,
            contended: false,
        };
        // A hand-over to an earlier acquisition on the same interrupt (its release's reply and its
        // publication both tell) is not news for this one.
        interrupt.waker().take_handed();
        let mut backoff = Backoff::new(self.retry_interval);
        let mut last_failure;
        let outcome = loop {
            let retry_in = match self.attempt_waiting(claim, &keys, &mut waiter, interrupt) {
                Ok(Step::Taken(acquisition)) => {
                    break Ok(Acquisition {
                        new_token: (waiter.token != claim.token).then(|| waiter.token.clone()),
                        contended: waiter.contended,
                        ..acquisition
                    })
                }
                Ok(Step::Held { retry_in }) => {
                    last_failure = None;
                    retry_in
                }
                Err(error) if error.is_transient() => {
                    if error.undo_sent() {
                        waiter.renew_token(self, &keys, claim.request.limit, interrupt);
                    }
                    last_failure = Some(error);
                    None
                }
                Err(error) => break Err(error),
            };
            let now = Instant::now();
            if now >= deadline {
                let waited = now - started;
                break Err(last_failure.unwrap_or(LockError::NotAcquired { waited }));
            }
            let pause = match last_failure {
                Some(_) => backoff.next_pause(),
                None => next_pause(self.subscriber.is_listening(), retry_in, &mut backoff),
            };
            if let Err(interrupted) = interrupt.sleep_until((now + pause).min(deadline)) {
                break Err(interrupted);
            }
        };
        if outcome.is_err() && waiter.queued_attempts > 0 {
            // Leave the queue (and pass on a lock handed to us meanwhile), whatever happened.
            let _ = self.leave(&keys, &waiter.token, &claim.request);
        }
        outcome
    }

    /// One attempt of a wait: a lock handed over meanwhile, else the first attempt (which takes
    /// a free lock ahead of the queue, unless fair), else a queued one. Waiters queue: a release
    /// hands the lock to the first of them, so a thread that releases and re-acquires in a loop
    /// cannot starve them.
    fn attempt_waiting(
        &self,
        claim: &Claim,
        keys: &LockKeys,
        waiter: &mut Waiter,
        interrupt: &Interrupt,
    ) -> Result<Step, LockError> {
        let request = &claim.request;
        let mine = Claim {
            key: claim.key,
            token: &waiter.token,
            request: *request,
        };
        // A release's message (through the subscriber, or the reply to a release by this
        // process) that handed the lock to this token after the attempt that queued it. With
        // `min_replicas` an attempt of our own confirms instead, which writes and is acknowledged
        // (`WAIT` counts a connection's writes, and every one before them).
        if let Some(fencing_token) = waiter
            .queued_at
            .and_then(|_| interrupt.waker().take_handed())
            .filter(|_| self.replication.is_none())
        {
            let extended = self.extend_handed(&mine, keys, interrupt)?;
            return Ok(waiter.handed(fencing_token, extended));
        }
        if !request.fair && waiter.queued_attempts == 0 {
            if let Some(fencing_token) = self.try_acquire(&mine, interrupt)? {
                return Ok(Step::Taken(Acquisition::for_claimed_ttl(fencing_token)));
            }
            waiter.contended = true;
        }
        waiter.queued_attempts += 1;
        let sent = Instant::now();
        let again = waiter.queued;
        let attempt = self.attempt_queued(&mine, keys, again, interrupt)?;
        Ok(match attempt {
            // Taken by an attempt of a queued waiter: for the heartbeat at most (see wait.lua).
            Attempt::Acquired(fencing_token) if again => {
                let extended = self.extend_handed(&mine, keys, interrupt)?;
                waiter.handed(fencing_token, extended)
            }
            Attempt::Acquired(fencing_token) => {
                Step::Taken(Acquisition::for_claimed_ttl(fencing_token))
            }
            Attempt::Held { retry_in } => {
                waiter.queued = true;
                waiter.queued_at = Some(sent);
                waiter.contended = true;
                Step::Held { retry_in }
            }
            Attempt::NotQueued => {
                waiter.queued = false;
                waiter.contended = true;
                Step::Held { retry_in: None }
            }
        })
    }

    /// A queued attempt. `queued`: the waiter is in the queue already; then the attempt changes
    /// nothing unless it still is, so a copy of it that Redis runs late is harmless: it needs no
    /// undo, and a reply that never came costs the waiter neither its token nor its place.
    fn attempt_queued(
        &self,
        claim: &Claim,
        keys: &LockKeys,
        queued: bool,
        interrupt: &Interrupt,
    ) -> Result<Attempt, LockError> {
        let ttl = claim.request.ttl_ms.to_string();
        let limit = claim.request.limit.to_string();
        let heartbeat = HEARTBEAT_MS.as_bytes();
        let channel = self.subscriber.own_channel();
        let args: [&[u8]; 6] = [
            claim.token.as_bytes(),
            ttl.as_bytes(),
            heartbeat,
            channel.as_deref().unwrap_or_default(),
            if queued { b"1" } else { b"0" },
            limit.as_bytes(),
        ];
        let (wait, leave, leave_len) = queue_scripts(&claim.request);
        let undo = |conn: &mut redis::Connection| {
            let leave_args = [claim.token.as_bytes(), heartbeat, limit.as_bytes()];
            leave.send_after(conn, &keys.all(), &leave_args[..leave_len]);
        };
        let wait_args = if claim.request.is_shared() {
            &args[..]
        } else {
            &args[..5]
        };
        let undo = (!queued).then_some(&undo as Undo);
        self.scripted_attempt(claim, keys, wait, wait_args, undo, interrupt)
    }

    /// Extends a lock just handed to `claim.token` with the hand-off's short TTL to the claim's
    /// own, before it counts as taken: false when the hand-off lapsed first (the waiter stalled
    /// past it). An extension cut short may still run: the release written after it on its
    /// connection hands the lock on, lest a waiter that then gave up hold it for its full TTL.
    /// With `min_replicas` it counts once acknowledged, as an acquisition does (a failover must
    /// keep the lock for its whole TTL, not the hand-off's); unacknowledged, the lock is released.
    fn extend_handed(
        &self,
        claim: &Claim,
        keys: &LockKeys,
        interrupt: &Interrupt,
    ) -> Result<bool, LockError> {
        if !handoff_is_short(claim.request.ttl()) {
            return Ok(true);
        }
        let (token, ttl) = (claim.token.as_bytes(), claim.request.ttl_ms.to_string());
        let limit = claim.request.limit.to_string();
        let (extend, release, release_len) = match claim.request.is_shared() {
            true => (&*REFRESH_SHARED, &*RELEASE_SHARED, 3),
            false => (&*REFRESH, &*RELEASE, 2),
        };
        let release_args = [token, HEARTBEAT_MS.as_bytes(), limit.as_bytes()];
        let undo = |conn: &mut redis::Connection| {
            release.send_after(conn, &keys.all(), &release_args[..release_len]);
        };
        let (extended, acknowledged) =
            self.round_trip(&keys.lock, interrupt, Some(&undo), |conn, _| {
                let extended = extend.run::<i64>(conn, &[&keys.lock], &[token, ttl.as_bytes()])?;
                Ok((extended == 1, self.acknowledged_if(extended == 1, conn)?))
            })?;
        if extended {
            self.check_replicated(claim, acknowledged)?;
        }
        Ok(extended)
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
        let (reply, acknowledged) = self.round_trip(&keys.lock, interrupt, undo, |conn, _| {
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
    fn acknowledged_if(
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

    /// An acquisition that fewer than `min_replicas` acknowledged does not count: it is released
    /// (to completion, even while Ruby interrupts us) and the caller told how many did.
    fn check_replicated(&self, claim: &Claim, acknowledged: Option<u32>) -> Result<(), LockError> {
        let (Some(replication), Some(reached)) = (self.replication, acknowledged) else {
            return Ok(());
        };
        if reached >= replication.replicas {
            return Ok(());
        }
        let key = self.redis_key(claim.key);
        let undo = Interrupt::for_current_thread();
        let _ = self.release(claim.key, claim.token, claim.request.limit, &undo);
        Err(LockError::NotReplicated {
            addr: self
                .router
                .pool_for(&key)
                .map(|p| p.addr())
                .unwrap_or_default(),
            needed: replication.replicas,
            reached,
            timeout: replication.timeout,
        })
    }

    /// Leaves the queue of `keys` for good, to completion (even while Ruby interrupts us).
    fn leave(&self, keys: &LockKeys, token: &str, request: &Request) -> Result<(), LockError> {
        let limit = request.limit.to_string();
        let args: [&[u8]; 3] = [token.as_bytes(), HEARTBEAT_MS.as_bytes(), limit.as_bytes()];
        let (_, leave, args_len) = queue_scripts(request);
        self.round_trip(
            &keys.lock,
            &Interrupt::for_current_thread(),
            None,
            |conn, _| leave.run::<Value>(conn, &keys.all(), &args[..args_len]),
        )
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
        let limit = limit.to_string();
        let (script, args_len) = if limit != "1" {
            (&*RELEASE_SHARED, 3)
        } else {
            (&*RELEASE, 2)
        };
        let args: [&[u8]; 3] = [token.as_bytes(), HEARTBEAT_MS.as_bytes(), limit.as_bytes()];
        self.round_trip(&keys.lock, interrupt, None, |conn, _| {
            match script.run::<Value>(conn, &keys.all(), &args[..args_len])? {
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
        self.round_trip(&redis_key, interrupt, None, |conn, _| {
            script
                .run::<i64>(conn, &[&redis_key], &[token.as_bytes(), ttl.as_bytes()])
                .map(|renewed| renewed == 1)
        })
    }

    /// Whether `token` holds the lock right now.
    pub fn owned(&self, key: &[u8], token: &str, interrupt: &Interrupt) -> Result<bool, LockError> {
        let redis_key = self.redis_key(key);
        self.round_trip(&redis_key, interrupt, None, |conn, _| {
            redis::cmd("GET")
                .arg(&redis_key)
                .query::<Option<Vec<u8>>>(conn)
                .map(|holder| holder.as_deref() == Some(token.as_bytes()))
        })
    }

    /// Whether anyone holds the lock right now.
    pub fn locked(&self, key: &[u8], interrupt: &Interrupt) -> Result<bool, LockError> {
        let redis_key = self.redis_key(key);
        self.round_trip(&redis_key, interrupt, None, |conn, _| {
            redis::cmd("EXISTS")
                .arg(&redis_key)
                .query::<i64>(conn)
                .map(|n| n == 1)
        })
    }

    /// Runs `command` on a pooled connection of the node that serves `route` (a full Redis key:
    /// every key a command touches lies in its slot). A connection found dead before any reply
    /// (EOF, reset, broken pipe) is replaced and the command sent again, as often as the pool
    /// has connections, plus once: every command here is safe to repeat with the same token.
    /// When the reply was cut short (interrupt, timeout) the command may still run: `undo` is
    /// then sent on the same connection, so that Redis runs it after the command, never before.
    /// On a Cluster, MOVED is followed (and the slot map updated); a slot that is migrating
    /// (ASK, TRYAGAIN) or failing over (CLUSTERDOWN, a node gone) is asked again after a pause,
    /// for up to `read_timeout`. ASK is not followed: a lock's keys would then be split between
    /// two nodes (a fencing counter made anew on the importing one); Redis runs the commands of
    /// a slot again once its migration ends.
    pub(crate) fn round_trip<T>(
        &self,
        route: &[u8],
        interrupt: &Interrupt,
        undo: Option<Undo>,
        mut command: impl FnMut(&mut redis::Connection, Sent) -> Result<T, RedisError>,
    ) -> Result<T, LockError> {
        let settings = self.router.settings();
        let retry_limit = settings.pool_size + 1;
        let mut sent = Sent::default();
        let mut dropped = 0;
        let mut stray_signals = 0;
        let mut moved = 0;
        let mut cluster_deadline = None;
        loop {
            let pool = self.router.pool_for(route)?;
            let mut conn = match pool.checkout(interrupt) {
                Err(error) if self.router.is_cluster() && error.is_transient() => {
                    // A node gone: its replica may be taking over.
                    self.router.topology_changed();
                    self.cluster_pause(&mut cluster_deadline, interrupt, error)?;
                    continue;
                }
                checked_out => checked_out?,
            };
            interrupt.check()?;
            let error = match command(&mut conn.redis, sent) {
                Ok(value) => return Ok(value),
                Err(error) => error,
            };
            let failure = classify(error, undo.is_some(), interrupt.takes_signals_to_ruby());
            conn.poisoned = !failure.keeps_connection();
            if let (Failure::Interrupted | Failure::Unusable(_), Some(undo)) = (&failure, undo) {
                undo(&mut conn.redis);
            }
            drop(conn);
            match failure {
                // Any pooled connection may have died while idle (a restart, CLIENT KILL, a
                // server or load balancer timeout), used before or not.
                Failure::Dropped(_) if dropped < retry_limit => {
                    dropped += 1;
                    sent.resent = true;
                    if self.router.is_cluster() {
                        self.router.topology_changed();
                    }
                }
                Failure::Signalled(_) if stray_signals < STRAY_SIGNAL_RETRIES => {
                    stray_signals += 1;
                    sent.resent = true;
                }
                Failure::Dropped(error) | Failure::Signalled(error) => {
                    return Err(self.connection_error(&pool.addr(), &error, false));
                }
                Failure::Unusable(error) => {
                    return Err(self.connection_error(&pool.addr(), &error, undo.is_some()));
                }
                Failure::Interrupted => return Err(LockError::Interrupted),
                Failure::Refused(error) if self.router.is_cluster() => {
                    match cluster_redirect(&error) {
                        Some(Redirect::Moved(node)) if moved < MOVED_LIMIT => {
                            moved += 1;
                            self.router.moved(route, node);
                        }
                        Some(Redirect::Moved(_)) | None => {
                            return Err(refusal(&pool.addr(), &error))
                        }
                        Some(redirect @ (Redirect::Migrating | Redirect::Down)) => {
                            sent.migrating = true;
                            if redirect == Redirect::Down {
                                self.router.topology_changed();
                            }
                            let refused = refusal(&pool.addr(), &error);
                            self.cluster_pause(&mut cluster_deadline, interrupt, refused)?;
                        }
                    }
                }
                Failure::Refused(error) => return Err(refusal(&pool.addr(), &error)),
            }
        }
    }

    /// A pause before a Cluster slot is asked again; `error` once `read_timeout` has passed
    /// since the first pause.
    fn cluster_pause(
        &self,
        deadline: &mut Option<Instant>,
        interrupt: &Interrupt,
        error: LockError,
    ) -> Result<(), LockError> {
        let now = Instant::now();
        let deadline = *deadline.get_or_insert(now + self.router.settings().read_timeout);
        if now >= deadline {
            return Err(error);
        }
        interrupt.sleep_until((now + CLUSTER_RETRY_PAUSE).min(deadline))
    }

    /// `undone`: an undo of the command was sent after it.
    fn connection_error(&self, addr: &str, error: &RedisError, undone: bool) -> LockError {
        let cause = if error.is_timeout() {
            format!(
                "no reply within read_timeout ({:.3}s)",
                self.router.settings().read_timeout.as_secs_f64()
            )
        } else {
            error.to_string()
        };
        LockError::Connection {
            addr: addr.to_owned(),
            cause,
            timed_out: error.is_timeout(),
            undone,
        }
    }
}

/// The scripts of a queued attempt and of leaving the queue, and how many ARGV leaving takes.
fn queue_scripts(request: &Request) -> (&'static LuaScript, &'static LuaScript, usize) {
    if request.is_shared() {
        (&WAIT_SHARED, &LEAVE_SHARED, 3)
    } else {
        (&WAIT, &LEAVE, 2)
    }
}

/// What a round trip tells its command about earlier sends of it.
#[derive(Clone, Copy, Default)]
pub(crate) struct Sent {
    /// An earlier send may have run before its reply was lost.
    resent: bool,
    /// The key's Cluster slot is migrating (or was failing over): send one command, not a
    /// pipeline of several.
    migrating: bool,
}

/// What one attempt of a wait came to.
enum Step {
    Taken(Acquisition),
    Held { retry_in: Option<Duration> },
}

/// A waiting thread's state across its attempts.
struct Waiter {
    /// The token it acquires with (the claim's, until an attempt had to be undone).
    token: String,
    registration: Registration,
    queued_attempts: u32,
    /// Its last queued attempt left it in the queue.
    queued: bool,
    /// When the last attempt that left us queued was sent: a hand-off came after it.
    queued_at: Option<Instant>,
    /// An attempt found the lock held (see `Acquisition::contended`).
    contended: bool,
}

impl Waiter {
    /// A lock handed to this waiter with `fencing_token`: taken once `extended` to its TTL. A
    /// hand-off that lapsed first (the waiter stalled past it) also cost the waiter its place:
    /// it queues again at once.
    fn handed(&mut self, fencing_token: FencingToken, extended: bool) -> Step {
        if extended {
            return Step::Taken(Acquisition::for_claimed_ttl(fencing_token));
        }
        self.queued = false;
        self.queued_at = None;
        Step::Held {
            retry_in: Some(Duration::ZERO),
        }
    }

    /// Goes on with a fresh token: the undo of the attempt just cut short may still reach Redis
    /// after a later attempt, and must find nothing of this token's to undo.
    fn renew_token(&mut self, core: &LockCore, keys: &LockKeys, limit: u32, interrupt: &Interrupt) {
        self.token = token::new_token(limit);
        self.registration = core
            .subscriber
            .register(&keys.lock, &self.token, interrupt.waker());
        self.queued = false;
        self.queued_at = None;
    }
}
