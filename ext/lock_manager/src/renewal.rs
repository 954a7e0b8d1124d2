//! Lease renewal (`renew: true`): one background thread per process keeps every renewed lock
//! alive while its holder works, extending its TTL every third of it, only while its token
//! still holds the key, and never past `max_hold`.
//!
//! The thread runs no Ruby code and never holds the GVL. It renews one lease at a time, outside
//! the lock that guards the list, so taking or ending a lease never waits for Redis.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crate::gvl::{self, Interrupt};
use crate::lease_events::{self, LeaseEvent};
use crate::lock_core::LockCore;
use crate::per_process::{current_pid, PerProcess};
use crate::request::Request;

/// How soon a renewal that failed (Redis unreachable) is tried again, at most.
const RETRY_AFTER_FAILURE: Duration = Duration::from_millis(200);

/// What one held lock needs renewed: where, who, and what its lock call asked for.
pub struct LeaseTerms {
    pub core: Arc<LockCore>,
    pub key: Vec<u8>,
    pub token: String,
    /// Its TTL, limit and renewal: renewed until stopped (`Renewal::UntilReleased`), or never
    /// past `max_hold` after `taken` (`Renewal::Capped`).
    pub request: Request,
    pub taken: Instant,
}

impl LeaseTerms {
    fn ttl(&self) -> Duration {
        self.request.ttl()
    }

    fn hold_until(&self) -> Option<Instant> {
        self.request.renewal.hold_until(self.taken)
    }
}

/// The holder's side of a renewed lock. Dropping it (or `stop`) ends the renewal.
pub struct Lease {
    state: Arc<LeaseState>,
    renewer: Arc<Renewer>,
    /// The process whose renewer renews it: a forked child must not touch that renewer's mutex
    /// (its thread is not in the child, and may have held it at the fork).
    pid: u32,
}

#[derive(Default)]
struct LeaseState {
    lost: AtomicBool,
    stopped: AtomicBool,
}

/// A lease in the renewer's schedule.
struct Scheduled {
    terms: LeaseTerms,
    state: Arc<LeaseState>,
    due: Instant,
    /// When the lock expires unless renewed, as far as we know (counted from before the last
    /// renewal was sent: never later than the real expiry).
    expires: Instant,
}

#[derive(Default)]
struct Renewer {
    schedule: Mutex<Schedule>,
    changed: Condvar,
}

#[derive(Default)]
struct Schedule {
    renewals: Vec<Scheduled>,
    /// When the renewer's thread looks at `renewals` next (`None`: only when told). A renewal
    /// due later needs no wake-up: waking the thread for each lease started would cost a context
    /// switch per renewed lock cycle.
    looks_at: Option<Instant>,
}

static RENEWER: PerProcess<Renewer> = PerProcess::new();

impl Lease {
    /// Starts renewing a lock just acquired with a TTL of `terms.ttl`.
    pub fn start(terms: LeaseTerms) -> Lease {
        let (renewer, created) = RENEWER.get_or_create(Renewer::default);
        if created {
            let running = Arc::clone(&renewer);
            let started = thread::Builder::new()
                .name("lock_manager-renewer".into())
                .spawn(move || {
                    gvl::block_signals_in_this_thread();
                    running.run();
                });
            drop(started); // without a thread, locks expire by their TTL and are reported lost
        }
        let state = Arc::new(LeaseState::default());
        let now = Instant::now();
        let (due, expires) = (now + terms.ttl() / 3, now + terms.ttl());
        let renewal = Scheduled {
            due,
            expires,
            terms,
            state: Arc::clone(&state),
        };
        if let Ok(mut schedule) = renewer.schedule.lock() {
            if schedule.looks_at.is_none_or(|looks_at| due < looks_at) {
                renewer.changed.notify_all();
            }
            schedule.renewals.push(renewal);
        }
        Lease {
            state,
            renewer,
            pid: current_pid(),
        }
    }

    /// True once a renewal found the lock gone, or could not reach Redis before it expired,
    /// or `max_hold` ran out.
    pub fn is_lost(&self) -> bool {
        self.state.lost.load(Ordering::Acquire)
    }

    /// Ends the renewal; the lock keeps the TTL it has. Idempotent.
    pub fn stop(&self) {
        if self.state.stopped.swap(true, Ordering::AcqRel) || self.pid != current_pid() {
            return;
        }
        if let Ok(mut schedule) = self.renewer.schedule.lock() {
            schedule
                .renewals
                .retain(|renewal| !Arc::ptr_eq(&renewal.state, &self.state));
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Renewer {
    fn run(&self) {
        let Ok(mut schedule) = self.schedule.lock() else {
            return;
        };
        loop {
            let now = Instant::now();
            // Awake: whatever is added meanwhile is seen on the next turn of this loop.
            schedule.looks_at = Some(now);
            let next_due = schedule.renewals.iter().map(|renewal| renewal.due).min();
            match next_due {
                None => {
                    schedule.looks_at = None;
                    schedule = self
                        .changed
                        .wait(schedule)
                        .unwrap_or_else(|e| e.into_inner())
                }
                Some(due) if due > now => {
                    schedule.looks_at = Some(due);
                    schedule = self
                        .changed
                        .wait_timeout(schedule, due - now)
                        .map(|(guard, _)| guard)
                        .unwrap_or_else(|e| e.into_inner().0);
                }
                Some(_) => {
                    let index = schedule.renewals.iter().position(|r| r.due <= now);
                    let Some(renewal) = index.map(|i| schedule.renewals.swap_remove(i)) else {
                        continue;
                    };
                    drop(schedule);
                    let renewed = renew(renewal);
                    schedule = self.schedule.lock().unwrap_or_else(|e| e.into_inner());
                    // Stopped while we talked to Redis: it stays out.
                    if let Some(renewal) =
                        renewed.filter(|r| !r.state.stopped.load(Ordering::Acquire))
                    {
                        schedule.renewals.push(renewal);
                    }
                }
            }
        }
    }
}

/// One renewal; `None` when the lease is over (lost, or `max_hold` reached and expired).
fn renew(mut renewal: Scheduled) -> Option<Scheduled> {
    let now = Instant::now();
    let terms = &renewal.terms;
    let ttl = match terms.hold_until() {
        // Past `max_hold`: no more renewals; lost once the TTL it has runs out.
        Some(hold_until) if hold_until <= now && now >= renewal.expires => {
            return lose(renewal, "max_hold was reached and its TTL ran out")
        }
        Some(hold_until) if hold_until <= now => {
            renewal.due = renewal.expires;
            return Some(renewal);
        }
        Some(hold_until) => terms.ttl().min(hold_until - now),
        None => terms.ttl(),
    };
    let ttl_ms = (ttl.as_millis() as u64).max(1);
    let interrupt = Interrupt::for_current_thread();
    match terms.core.refresh(
        &terms.key,
        &terms.token,
        ttl_ms,
        terms.request.limit,
        &interrupt,
    ) {
        Ok(true) => {
            lease_events::record(|| LeaseEvent::Renewed {
                key: renewal.terms.key.clone(),
                ttl,
            });
            renewal.expires = now + ttl;
            // The last renewal before `max_hold` wakes us at `hold_until`, to report it lost.
            renewal.due = match terms.hold_until() {
                Some(hold_until) if ttl < terms.ttl() => hold_until,
                _ => now + terms.ttl() / 3,
            };
            Some(renewal)
        }
        Ok(false) => lose(renewal, "a renewal found it expired or held by another"),
        Err(_) if Instant::now() >= renewal.expires => {
            lose(renewal, "Redis could not be reached for its whole TTL")
        }
        Err(_) => {
            let left = renewal.expires - Instant::now();
            renewal.due = Instant::now() + RETRY_AFTER_FAILURE.min(left / 2);
            Some(renewal)
        }
    }
}

fn lose(renewal: Scheduled, cause: &'static str) -> Option<Scheduled> {
    renewal.state.lost.store(true, Ordering::Release);
    lease_events::record(|| LeaseEvent::Lost {
        key: renewal.terms.key.clone(),
        held: renewal.terms.taken.elapsed(),
        cause,
    });
    None
}
