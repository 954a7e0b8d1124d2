//! A wait for a lock: attempts until the claim holds it or the deadline passes, woken by the
//! releases the subscriber hears (or by a backoff when it hears none), queued so that a release
//! hands the lock to the first waiter, and leaving the queue whatever ends the wait.

use std::time::{Duration, Instant};

use redis::Value;

use crate::error::LockError;
use crate::gvl::Interrupt;
use crate::keys::LockKeys;
use crate::replies::{Attempt, FencingToken};
use crate::request::Request;
use crate::scripts::{
    LuaScript, LEAVE, LEAVE_SHARED, REFRESH, REFRESH_SHARED, RELEASE, RELEASE_SHARED, WAIT,
    WAIT_SHARED,
};
use crate::subscriber::Registration;
use crate::token;
use crate::transport::Undo;
use crate::wait::{handoff_is_short, next_pause, Backoff, HEARTBEAT_MS};

use super::{Acquisition, Claim, LockCore};

impl LockCore {
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
            self.router
                .round_trip(&keys.lock, interrupt, Some(&undo), |conn, _| {
                    let extended =
                        extend.run::<i64>(conn, &[&keys.lock], &[token, ttl.as_bytes()])?;
                    Ok((extended == 1, self.acknowledged_if(extended == 1, conn)?))
                })?;
        if extended {
            self.check_replicated(claim, acknowledged)?;
        }
        Ok(extended)
    }

    /// Leaves the queue of `keys` for good, to completion (even while Ruby interrupts us).
    fn leave(&self, keys: &LockKeys, token: &str, request: &Request) -> Result<(), LockError> {
        let limit = request.limit.to_string();
        let args: [&[u8]; 3] = [token.as_bytes(), HEARTBEAT_MS.as_bytes(), limit.as_bytes()];
        let (_, leave, args_len) = queue_scripts(request);
        self.router
            .round_trip(
                &keys.lock,
                &Interrupt::for_current_thread(),
                None,
                |conn, _| leave.run::<Value>(conn, &keys.all(), &args[..args_len]),
            )
            .map(|_| ())
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
