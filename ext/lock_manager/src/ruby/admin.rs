//! What `LockManager::Admin` asks of `LockManager::Native::Locker` (see `admin.rs`): a SCAN of a
//! pattern (`LockManager::Native::AdminScan`), a read of given keys, a force-release. Locks come
//! to Ruby as plain arrays, which `lib/lock_manager/admin.rb` makes its Structs:
//! - a lock: `[key, limit or nil, holders, waiters, parked]` (parked: how many jobs are parked
//!   on it);
//! - a holder: `[token, jid, host, pid, thread, since ms, ttl ms]`: host, pid, thread and since
//!   from its token when it has the holder format (`token.rs`), else the token is a job's id;
//! - a waiter: `[token, host, pid, thread, since µs]` (since: when it queued, Redis's clock);
//! - a limiter: `[name, kind, used, remaining, retry_after s, reset_after s, rule, rule]` (the
//!   rule as its script keeps it: GCRA's interval in µs and burst, a window's µs and limit).

use std::sync::{Arc, Mutex};

use magnus::{method, prelude::*, Error, IntoValue, RArray, RClass, RModule, RString, Ruby, Value};

use crate::admin::{HolderView, LimiterView, LockView, Scan, WaiterView};
use crate::error::LockError;
use crate::limits::LimitKind;
use crate::lock_core::LockCore;
use crate::ruby::call::{blocking, copy_bytes, copy_keys};
use crate::ruby::errors;
use crate::ruby::locker::NativeLocker;
use crate::token;

pub fn init(ruby: &Ruby, native: RModule) -> Result<(), Error> {
    let locker: RClass = native.const_get("Locker")?;
    locker.define_method("admin_scan", method!(admin_scan, 2))?;
    locker.define_method("admin_locks", method!(admin_locks, 2))?;
    locker.define_method("admin_release", method!(admin_release, 1))?;
    locker.define_method("admin_limiters", method!(admin_limiters, 2))?;
    locker.define_method("admin_reset_limiter", method!(admin_reset_limiter, 2))?;
    let scan = native.define_class("AdminScan", ruby.class_object())?;
    scan.undef_default_alloc_func();
    scan.define_method("next_batch", method!(NativeScan::next_batch, 0))?;
    Ok(())
}

/// A SCAN under way: each `next_batch` gives the next keys (without details) or locks.
#[magnus::wrap(class = "LockManager::Native::AdminScan", free_immediately, size)]
struct NativeScan {
    core: Arc<LockCore>,
    pattern: Vec<u8>,
    details: bool,
    scan: Mutex<Scan>,
}

/// A SCAN of the locks whose keys (without the prefix) match `pattern`, a Redis glob; `details`:
/// their holders and waiters too, else only their keys.
fn admin_scan(rb_self: &NativeLocker, pattern: RString, details: bool) -> NativeScan {
    let pattern = copy_bytes(pattern);
    NativeScan {
        scan: Mutex::new(Scan::new(rb_self.core(), &pattern)),
        core: Arc::clone(rb_self.core()),
        pattern,
        details,
    }
}

impl NativeScan {
    /// An Array of keys, or of locks; nil once every master has been scanned.
    fn next_batch(ruby: &Ruby, rb_self: &Self) -> Result<Option<RArray>, Error> {
        let to_ruby = |e| listing_error(ruby, e, &rb_self.pattern);
        let core = &rb_self.core;
        let scan = || rb_self.scan.lock().unwrap_or_else(|e| e.into_inner());
        if rb_self.details {
            let locks = blocking(ruby, to_ruby, |i| scan().next_locks(core, i))?;
            return Ok(locks.map(|locks| ruby.ary_from_iter(locks.iter().map(|l| lock(ruby, l)))));
        }
        let keys = blocking(ruby, to_ruby, |i| scan().next_keys(core, i))?;
        Ok(keys.map(|(_, keys)| ruby.ary_from_iter(keys.iter().map(|k| text(ruby, k)))))
    }
}

/// Each of `keys` as a lock, or nil when nobody holds it, waits for it or is parked on it.
/// `pattern`: what found them, for error messages (nil: they name the first key).
fn admin_locks(
    ruby: &Ruby,
    rb_self: &NativeLocker,
    keys: RArray,
    pattern: Option<RString>,
) -> Result<RArray, Error> {
    let keys = copy_keys(keys)?;
    let first = keys.first().cloned().unwrap_or_default();
    let pattern = pattern.map(copy_bytes);
    let to_ruby = |e| match &pattern {
        Some(pattern) => listing_error(ruby, e, pattern),
        None => errors::for_key_bytes(ruby, e, &first),
    };
    let views = blocking(ruby, to_ruby, |i| rb_self.core().inspect_all(&keys, i))?;
    Ok(ruby.ary_from_iter(
        views
            .iter()
            .map(|view| view.as_ref().map(|v| lock(ruby, v))),
    ))
}

/// Removes every holder of `key` and wakes its waiters: true when a lock was removed.
fn admin_release(ruby: &Ruby, rb_self: &NativeLocker, key: RString) -> Result<bool, Error> {
    let key_bytes = copy_bytes(key);
    let to_ruby = |e| errors::for_key(ruby, e, key);
    blocking(ruby, to_ruby, |i| {
        rb_self.core().force_release(&key_bytes, i)
    })
}

/// The limiters whose names match `pattern`, sorted, the first `limit` (nil: all).
fn admin_limiters(
    ruby: &Ruby,
    rb_self: &NativeLocker,
    pattern: RString,
    limit: Option<usize>,
) -> Result<RArray, Error> {
    let pattern = copy_bytes(pattern);
    let to_ruby = |e| {
        let subject = format!("limiters matching {}", errors::quote_key(&pattern));
        errors::for_subject(ruby, e, &subject)
    };
    let views = blocking(ruby, to_ruby, |i| {
        rb_self.core().limiter_views(&pattern, limit, i)
    })?;
    Ok(ruby.ary_from_iter(views.iter().map(|view| limiter(ruby, view))))
}

/// Forgets the counts of the limiters `name` of `kind` ("gcra", "window", "sliding"; nil: every
/// kind): whether one had counted anything.
fn admin_reset_limiter(
    ruby: &Ruby,
    rb_self: &NativeLocker,
    name: RString,
    kind: Option<String>,
) -> Result<bool, Error> {
    let kinds = match kind.as_deref().map(LimitKind::parse) {
        None => LimitKind::ALL.to_vec(),
        Some(Some(kind)) => vec![kind],
        Some(None) => {
            let message = format!("unknown limiter kind {:?}", kind.unwrap_or_default());
            return Err(Error::new(ruby.exception_arg_error(), message));
        }
    };
    let name_bytes = copy_bytes(name);
    let to_ruby = |e| {
        let subject = format!("limiter {}", errors::quote_key(&name_bytes));
        errors::for_subject(ruby, e, &subject)
    };
    blocking(ruby, to_ruby, |i| {
        rb_self.core().reset_named(&name_bytes, &kinds, i)
    })
}

/// The gem's exception for `error` (a ConnectionError for Redis down...), its message about the
/// listing rather than one lock.
fn listing_error(ruby: &Ruby, error: LockError, pattern: &[u8]) -> Error {
    let subject = format!("locks matching {}", errors::quote_key(pattern));
    errors::for_subject(ruby, error, &subject)
}

fn lock(ruby: &Ruby, view: &LockView) -> Value {
    let holders = ruby.ary_from_iter(view.holders.iter().map(|h| holder(ruby, h)));
    let waiters = ruby.ary_from_iter(view.waiters.iter().map(|w| waiter(ruby, w)));
    (
        text(ruby, &view.key),
        view.limit(),
        holders,
        waiters,
        view.parked,
    )
        .into_value_with(ruby)
}

fn limiter(ruby: &Ruby, view: &LimiterView) -> Value {
    let kind = std::str::from_utf8(view.kind.name()).unwrap_or_default();
    let state = &view.state;
    let [first, second] = &state.rule;
    (
        text(ruby, &view.name),
        kind,
        state.used,
        state.remaining,
        state.retry_after.as_secs_f64(),
        state.reset_after.as_secs_f64(),
        first.as_str(),
        second.as_str(),
    )
        .into_value_with(ruby)
}

fn holder(ruby: &Ruby, holder: &HolderView) -> Value {
    let shown = text(ruby, &holder.token);
    match token::parse(&holder.token) {
        Some(who) => (
            shown,
            ruby.qnil(),
            ruby.str_new(who.host),
            who.pid,
            who.thread,
            who.since_ms,
            holder.ttl_ms,
        )
            .into_value_with(ruby),
        None => {
            let nil = ruby.qnil();
            (shown, shown, nil, nil, nil, nil, holder.ttl_ms).into_value_with(ruby)
        }
    }
}

fn waiter(ruby: &Ruby, waiter: &WaiterView) -> Value {
    let shown = text(ruby, &waiter.token);
    let nil = ruby.qnil().as_value();
    let who = token::parse(&waiter.token);
    let host = who
        .as_ref()
        .map_or(nil, |w| ruby.str_new(w.host).as_value());
    let pid = who.as_ref().map_or(nil, |w| w.pid.into_value_with(ruby));
    let thread = who.as_ref().map_or(nil, |w| w.thread.into_value_with(ruby));
    (shown, host, pid, thread, waiter.since_us).into_value_with(ruby)
}

/// A String of `bytes`: UTF-8 when they are, else binary (keys may be any bytes).
fn text(ruby: &Ruby, bytes: &[u8]) -> RString {
    match std::str::from_utf8(bytes) {
        Ok(text) => ruby.str_new(text),
        Err(_) => ruby.str_from_slice(bytes),
    }
}
