//! `LockManager::Locker`: the Ruby object around one `LockCore` (one pool, one key prefix).
//!
//! Arguments arrive checked and converted by the Ruby layer (`lib/lock_manager/locker.rb`);
//! every Redis round trip and every wait runs without the GVL.

use std::time::{Duration, Instant};

use magnus::{prelude::*, Error, RModule, RString, Ruby, Value};

use crate::error::LockError;
use crate::gvl::{self, Interrupt};
use crate::lock::{Claim, LockCore, LockSettings};
use crate::pool::PoolSettings;
use crate::ruby_errors;

#[magnus::wrap(class = "LockManager::Locker", free_immediately, size)]
pub struct Locker {
    core: LockCore,
}

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
            .map(|core| Locker { core })
            .map_err(|e| ruby_errors::to_ruby_unkeyed(ruby, e))
    }

    /// Runs the block while holding the lock, as one of at most `limit` holders (1: the plain
    /// lock). `fair`: waiters queue in order. Returns nil when the lock was taken (and `wait` is
    /// nil), true when the block ran and the lock was released, false when the block ran but the
    /// lock was lost meanwhile (it expired: the release found another token, or none).
    #[allow(clippy::too_many_arguments)]
    pub fn synchronize(
        ruby: &Ruby,
        rb_self: &Self,
        key: RString,
        ttl_ms: u64,
        wait: Option<f64>,
        limit: u32,
        fair: bool,
    ) -> Result<Option<bool>, Error> {
        let core = &rb_self.core;
        let key_bytes = copy_bytes(key);
        let limit = limit.max(1);
        let Some(token) = acquire_token(ruby, core, key, &key_bytes, ttl_ms, limit, fair, wait)?
        else {
            return Ok(None);
        };
        let outcome = ruby.yield_value::<(), Value>(());
        let released =
            gvl::without_gvl_to_completion(|i| core.release(&key_bytes, &token, limit, i));
        let held_to_the_end = match released {
            Ok(held) => held,
            Err(error) => {
                report_release(ruby, key, error);
                true // unknown: Redis did not say; the lock expires by its TTL
            }
        };
        outcome.map(|_| Some(held_to_the_end))
    }

    /// One attempt: the new token, or nil when someone else holds the lock.
    pub fn try_acquire(
        ruby: &Ruby,
        rb_self: &Self,
        key: RString,
        ttl_ms: u64,
    ) -> Result<Option<String>, Error> {
        let core = &rb_self.core;
        let key_bytes = copy_bytes(key);
        match acquire_token(ruby, core, key, &key_bytes, ttl_ms, 1, false, None)? {
            Some(token) => hand_over(ruby, core, &key_bytes, token).map(Some),
            None => Ok(None),
        }
    }

    /// Waits up to `wait` seconds; the new token, or raises LockNotAcquired.
    pub fn acquire(
        ruby: &Ruby,
        rb_self: &Self,
        key: RString,
        ttl_ms: u64,
        wait: f64,
        fair: bool,
    ) -> Result<String, Error> {
        let core = &rb_self.core;
        let key_bytes = copy_bytes(key);
        let token = acquire_token(ruby, core, key, &key_bytes, ttl_ms, 1, fair, Some(wait))?
            .expect("a blocking acquire returns a token or raises");
        hand_over(ruby, core, &key_bytes, token)
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
            rb_self.core.refresh(&key_bytes, &token, ttl_ms, i)
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
#[allow(clippy::too_many_arguments)]
fn acquire_token(
    ruby: &Ruby,
    core: &LockCore,
    key: RString,
    key_bytes: &[u8],
    ttl_ms: u64,
    limit: u32,
    fair: bool,
    wait: Option<f64>,
) -> Result<Option<String>, Error> {
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
            None => core.try_acquire(&claim, interrupt),
            Some((started, deadline)) => core
                .acquire_until(&claim, started, deadline, interrupt)
                .map(|()| true),
        }
    })?;
    Ok(acquired.then_some(token))
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

/// Returns a freshly taken lock's token to Ruby, unless an interrupt is already pending:
/// then the lock is released first, so it is not leaked by the exception.
fn hand_over(ruby: &Ruby, core: &LockCore, key: &[u8], token: String) -> Result<String, Error> {
    if let Err(interrupt) = ruby.thread_check_ints() {
        let _ = gvl::without_gvl_to_completion(|i| core.release(key, &token, 1, i));
        return Err(interrupt);
    }
    Ok(token)
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
