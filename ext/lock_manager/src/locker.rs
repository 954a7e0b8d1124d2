//! `LockManager::Locker`: the Ruby object around one `LockCore` (one pool, one key prefix).
//!
//! Arguments arrive checked and converted by the Ruby layer (`lib/lock_manager/locker.rb`);
//! every Redis round trip and every wait runs without the GVL.

use std::sync::Arc;
use std::time::{Duration, Instant};

use magnus::{prelude::*, typed_data::Obj, Error, RModule, RString, Ruby, Value};

use crate::error::LockError;
use crate::gvl::{self, Interrupt};
use crate::lock::{Acquisition, Claim, FencingToken, LockCore, LockSettings};
use crate::pool::PoolSettings;
use crate::renewal::{self, LeaseTerms};
use crate::ruby_errors;

#[magnus::wrap(class = "LockManager::Locker", free_immediately, size)]
pub struct Locker {
    core: Arc<LockCore>,
}

/// `LockManager::Lease`: the renewal of one lock taken with `renew: true`, as Ruby sees it.
#[magnus::wrap(class = "LockManager::Lease", free_immediately, size)]
pub struct Lease(Arc<renewal::Lease>);

impl Lease {
    /// Whether the renewal found the lock lost (expired, taken by another, max_hold reached).
    pub fn is_lost(&self) -> bool {
        self.0.is_lost()
    }

    /// Stops renewing: the lock keeps its current TTL.
    pub fn stop(&self) {
        self.0.stop();
    }
}

/// How a lock taken with `renew: true` is renewed: `max_hold_ms` caps it (`None`: no cap).
#[derive(Clone, Copy)]
pub struct Renewal {
    max_hold_ms: Option<u64>,
}

/// What Ruby receives for a lock handle: the token, the fencing token, the lease (or nil).
type Handle = (String, FencingToken, Option<Obj<Lease>>);

impl Locker {
    #[allow(clippy::too_many_arguments)]
    pub fn build(
        ruby: &Ruby,
        redis_url: String,
        pool_size: u32,
        pool_timeout: f64,
        connect_timeout: f64,
        read_timeout: f64,
        retry_interval: f64,
        key_prefix: RString,
    ) -> Result<Locker, Error> {
        let seconds = |name: &str, value: f64| {
            Duration::try_from_secs_f64(value)
                .ok()
                .filter(|d| !d.is_zero())
                .ok_or_else(|| {
                    LockError::Argument(format!("{name} must be a positive number of seconds"))
                })
        };
        let settings = (|| {
            if pool_size == 0 {
                return Err(LockError::Argument("pool_size must be at least 1".into()));
            }
            Ok(LockSettings {
                pool: PoolSettings {
                    redis_url,
                    pool_size,
                    pool_timeout: seconds("pool_timeout", pool_timeout)?,
                    connect_timeout: seconds("connect_timeout", connect_timeout)?,
                    read_timeout: seconds("read_timeout", read_timeout)?,
                },
                key_prefix: unsafe { key_prefix.as_slice() }.to_vec(),
                retry_interval: seconds("retry_interval", retry_interval)?,
            })
        })();
        settings
            .and_then(LockCore::new)
            .map(|core| Locker {
                core: Arc::new(core),
            })
            .map_err(|e| ruby_errors::to_ruby_unkeyed(ruby, e))
    }

    /// Runs the block while holding the lock, as one of at most `limit` holders (1: the plain
    /// lock). `fair`: waiters queue in order. `renew`: renewed while the block runs, for at most
    /// `max_hold_ms` (nil: no cap). The block receives the fencing token and the lease (nil
    /// without `renew`). Returns nil when the lock was taken (and `wait` is nil), true when the
    /// block ran and the lock was released, false when the block ran but the lock was lost
    /// meanwhile (it expired: the release found another token, or none; or its renewal failed).
    #[allow(clippy::too_many_arguments)]
    pub fn synchronize(
        ruby: &Ruby,
        rb_self: &Self,
        key: RString,
        ttl_ms: u64,
        wait: Option<f64>,
        limit: u32,
        fair: bool,
        renew: bool,
        max_hold_ms: Option<u64>,
    ) -> Result<Option<bool>, Error> {
        let core = &rb_self.core;
        let key_bytes = copy_bytes(key);
        let limit = limit.max(1);
        let claim = (ttl_ms, limit, fair);
        let Some((token, acquired)) = acquire_token(ruby, core, key, &key_bytes, claim, wait)?
        else {
            return Ok(None);
        };
        let renewal = renew.then_some(Renewal { max_hold_ms });
        let lease = start_lease(core, &key_bytes, &token, &acquired, ttl_ms, limit, renewal);
        let shown = lease
            .as_ref()
            .filter(|_| renew)
            .map(|lease| ruby.obj_wrap(Lease(Arc::clone(lease))));
        let outcome = ruby.yield_values::<_, Value>((acquired.fencing_token, shown));
        if let Some(lease) = &lease {
            lease.stop();
        }
        let released =
            gvl::without_gvl_to_completion(|i| core.release(&key_bytes, &token, limit, i));
        let lost_by_renewal = lease.is_some_and(|lease| lease.is_lost());
        let held_to_the_end = match released {
            Ok(held) => held && !lost_by_renewal,
            Err(error) => {
                report_release(ruby, key, error);
                !lost_by_renewal // otherwise unknown: the lock expires by its TTL
            }
        };
        outcome.map(|_| Some(held_to_the_end))
    }

    /// One attempt: `[token, fencing token, lease or nil]`, or nil when someone else holds it.
    pub fn try_acquire(
        ruby: &Ruby,
        rb_self: &Self,
        key: RString,
        ttl_ms: u64,
        renew: bool,
        max_hold_ms: Option<u64>,
    ) -> Result<Option<Handle>, Error> {
        let core = &rb_self.core;
        let key_bytes = copy_bytes(key);
        let renewal = renew.then_some(Renewal { max_hold_ms });
        match acquire_token(ruby, core, key, &key_bytes, (ttl_ms, 1, false), None)? {
            Some(taken) => hand_over(ruby, core, &key_bytes, taken, ttl_ms, renewal).map(Some),
            None => Ok(None),
        }
    }

    /// Waits up to `wait` seconds: `[token, fencing token, lease or nil]`, or raises
    /// LockNotAcquired.
    #[allow(clippy::too_many_arguments)]
    pub fn acquire(
        ruby: &Ruby,
        rb_self: &Self,
        key: RString,
        ttl_ms: u64,
        wait: f64,
        fair: bool,
        renew: bool,
        max_hold_ms: Option<u64>,
    ) -> Result<Handle, Error> {
        let core = &rb_self.core;
        let key_bytes = copy_bytes(key);
        let renewal = renew.then_some(Renewal { max_hold_ms });
        let taken = acquire_token(ruby, core, key, &key_bytes, (ttl_ms, 1, fair), Some(wait))?
            .expect("a blocking acquire returns a token or raises");
        hand_over(ruby, core, &key_bytes, taken, ttl_ms, renewal)
    }

    pub fn release(
        ruby: &Ruby,
        rb_self: &Self,
        key: RString,
        token: String,
    ) -> Result<bool, Error> {
        let key_bytes = copy_bytes(key);
        blocking(ruby, key, |i| {
            rb_self.core.release(&key_bytes, &token, 1, i)
        })
    }

    pub fn refresh(
        ruby: &Ruby,
        rb_self: &Self,
        key: RString,
        token: String,
        ttl_ms: u64,
    ) -> Result<bool, Error> {
        let key_bytes = copy_bytes(key);
        blocking(ruby, key, |i| {
            rb_self.core.refresh(&key_bytes, &token, ttl_ms, 1, i)
        })
    }

    pub fn owned(ruby: &Ruby, rb_self: &Self, key: RString, token: String) -> Result<bool, Error> {
        let key_bytes = copy_bytes(key);
        blocking(ruby, key, |i| rb_self.core.owned(&key_bytes, &token, i))
    }

    pub fn locked(ruby: &Ruby, rb_self: &Self, key: RString) -> Result<bool, Error> {
        let key_bytes = copy_bytes(key);
        blocking(ruby, key, |i| rb_self.core.locked(&key_bytes, i))
    }

    /// `[open, idle]` connections of this process's pool: for leak checks.
    pub fn pool_state(&self) -> (u32, u32) {
        self.core.pool().state()
    }
}

/// Acquires `key`: once (`wait` nil: `None` when taken) or waiting up to `wait` seconds. Each
/// attempt after a Ruby interrupt that raised nothing (Thread#wakeup) gets a fresh token: the
/// undo of an attempt cut short may still reach Redis, and must not release a later one.
/// `claim`: the TTL in ms, the limit, fairness. Returns the token and the acquisition.
fn acquire_token(
    ruby: &Ruby,
    core: &LockCore,
    key: RString,
    key_bytes: &[u8],
    (ttl_ms, limit, fair): (u64, u32, bool),
    wait: Option<f64>,
) -> Result<Option<(String, Acquisition)>, Error> {
    let deadline = wait.map(deadline_after);
    let mut token = String::new();
    let acquired = blocking(ruby, key, |interrupt| {
        token = new_token();
        let claim = Claim {
            key: key_bytes,
            token: &token,
            ttl_ms,
            limit,
            fair,
        };
        match deadline {
            None => core
                .try_acquire(&claim, interrupt)
                .map(|taken| taken.map(Acquisition::for_claimed_ttl)),
            Some((started, deadline)) => core
                .acquire_until(&claim, started, deadline, interrupt)
                .map(Some),
        }
    })?;
    Ok(acquired.map(|acquired| (token, acquired)))
}

/// Runs `work` without the GVL until it finishes. When Ruby interrupts it, Ruby's own
/// exception (Timeout::Error, Interrupt, a kill) is raised here, after Rust cleaned up; an
/// interrupt that raises nothing (Thread#wakeup) lets the work resume.
fn blocking<R>(
    ruby: &Ruby,
    key: RString,
    mut work: impl FnMut(&Interrupt) -> Result<R, LockError>,
) -> Result<R, Error> {
    loop {
        match gvl::without_gvl(|interrupt| work(interrupt)) {
            Err(LockError::Interrupted) => ruby.thread_check_ints()?,
            outcome => return outcome.map_err(|e| ruby_errors::to_ruby(ruby, e, key)),
        }
    }
}

/// Returns a freshly taken lock to Ruby (its renewal started when asked for), unless an
/// interrupt is already pending: then the lock is released first, so it is not leaked by the
/// exception.
fn hand_over(
    ruby: &Ruby,
    core: &Arc<LockCore>,
    key: &[u8],
    (token, acquired): (String, Acquisition),
    ttl_ms: u64,
    renewal: Option<Renewal>,
) -> Result<Handle, Error> {
    if let Err(interrupt) = ruby.thread_check_ints() {
        let _ = gvl::without_gvl_to_completion(|i| core.release(key, &token, 1, i));
        return Err(interrupt);
    }
    let lease = start_lease(core, key, &token, &acquired, ttl_ms, 1, renewal)
        .map(|lease| ruby.obj_wrap(Lease(lease)));
    Ok((token, acquired.fencing_token, lease))
}

/// The lease that keeps a lock just acquired: renewed (`renewal`), or extended once when a
/// release handed it over with a shorter TTL than `ttl_ms`; `None` when it needs neither.
fn start_lease(
    core: &Arc<LockCore>,
    key: &[u8],
    token: &str,
    acquired: &Acquisition,
    ttl_ms: u64,
    limit: u32,
    renewal: Option<Renewal>,
) -> Option<Arc<renewal::Lease>> {
    if renewal.is_none() && acquired.expires_early.is_none() {
        return None;
    }
    let now = Instant::now();
    Some(Arc::new(renewal::Lease::start(LeaseTerms {
        core: Arc::clone(core),
        key: key.to_vec(),
        token: token.to_owned(),
        ttl: Duration::from_millis(ttl_ms),
        limit,
        hold_until: renewal
            .as_ref()
            .and_then(|renewal| renewal.max_hold_ms)
            .map(|ms| now + Duration::from_millis(ms)),
        keep_renewing: renewal.is_some(),
        expires_early: acquired.expires_early,
    })))
}

/// A release that failed after the block cannot change what the block did: it is logged by
/// the Ruby layer (`LockManager.report_release`), never raised over the block's own outcome.
fn report_release(ruby: &Ruby, key: RString, error: LockError) {
    let problem = format!("{error}; the lock expires after its timeout");
    let reported = ruby
        .class_object()
        .const_get::<_, RModule>("LockManager")
        .and_then(|m| m.funcall::<_, _, Value>("report_release", (key, problem)));
    drop(reported);
}

fn copy_bytes(key: RString) -> Vec<u8> {
    unsafe { key.as_slice() }.to_vec()
}

fn new_token() -> String {
    uuid::Uuid::new_v4().hyphenated().to_string()
}

fn deadline_after(seconds: f64) -> (Instant, Instant) {
    let started = Instant::now();
    let wait = Duration::try_from_secs_f64(seconds).unwrap_or(Duration::ZERO);
    (started, started + wait)
}
