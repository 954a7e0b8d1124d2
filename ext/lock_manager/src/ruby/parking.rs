//! Parked jobs, on `LockManager::Native::Locker` and `Native::Lock` (see `parking.rs`).

use magnus::{method, prelude::*, Error, IntoValue, RArray, RClass, RModule, RString, Ruby};

use crate::parking::{ParkRequest, Parked};
use crate::ruby::call::{blocking, copy_bytes, copy_keys};
use crate::ruby::errors;
use crate::ruby::lock::NativeLock;
use crate::ruby::locker::NativeLocker;

pub fn init(native: RModule) -> Result<(), Error> {
    let locker: RClass = native.const_get("Locker")?;
    locker.define_method("park", method!(park, 9))?;
    locker.define_method("unpark", method!(unpark, 1))?;
    locker.define_method("parked_count", method!(parked_count, 1))?;
    locker.define_method("parked_entries", method!(parked_entries, 2))?;
    locker.define_method("delete_parked", method!(delete_parked, 2))?;
    let lock: RClass = native.const_get("Lock")?;
    lock.define_method("release_parked", method!(release_parked, 0))?;
    Ok(())
}

/// Parks the job `token` on `key` (a semaphore when `limit` > 1): its lock handed over for
/// `ttl_ms`, its fallback (`fallback`, a member of Sidekiq's `schedule`) `grace_ms` past the
/// lock's expiry, at most `most` parked (0: no limit), `push` its commands `[name, key, args...]`. Returns `[:parked, place]`,
/// `[:full, parked]` or `[:handed, 0]`.
#[allow(clippy::too_many_arguments)]
fn park(
    ruby: &Ruby,
    rb_self: &NativeLocker,
    key: RString,
    token: String,
    ttl_ms: u64,
    grace_ms: u64,
    most: u32,
    limit: u32,
    schedule: RString,
    fallback: RString,
    push: RArray,
) -> Result<RArray, Error> {
    let push = push
        .into_iter()
        .map(|command| copy_keys(RArray::try_convert(command)?))
        .collect::<Result<Vec<_>, Error>>()?;
    if push.iter().any(|command| command.len() < 2) {
        let message = "park: a push command is its name and its key at least";
        return Err(Error::new(ruby.exception_arg_error(), message));
    }
    let (key_bytes, schedule, fallback) =
        (copy_bytes(key), copy_bytes(schedule), copy_bytes(fallback));
    let job = ParkRequest {
        key: &key_bytes,
        token: &token,
        ttl_ms,
        grace_ms,
        most,
        limit,
        schedule: &schedule,
        fallback: &fallback,
        push: &push,
    };
    let to_ruby = |e| errors::for_key(ruby, e, key);
    let (state, count) = match blocking(ruby, to_ruby, |i| rb_self.core().park(&job, i))? {
        Parked::InLine(place) => ("parked", place),
        Parked::Full(parked) => ("full", parked),
        Parked::HandedNow => ("handed", 0),
    };
    Ok(ruby.ary_new_from_values(&[
        ruby.to_symbol(state).as_value(),
        count.into_value_with(ruby),
    ]))
}

/// The fallback of `key`'s parked jobs: the token a free lock went to, or nil.
fn unpark(ruby: &Ruby, rb_self: &NativeLocker, key: RString) -> Result<Option<RString>, Error> {
    let key_bytes = copy_bytes(key);
    let to_ruby = |e| errors::for_key(ruby, e, key);
    let token = blocking(ruby, to_ruby, |i| rb_self.core().unpark(&key_bytes, i))?;
    Ok(token.map(|token| ruby.str_from_slice(&token)))
}

fn parked_count(ruby: &Ruby, rb_self: &NativeLocker, key: RString) -> Result<u64, Error> {
    let key_bytes = copy_bytes(key);
    let to_ruby = |e| errors::for_key(ruby, e, key);
    blocking(ruby, to_ruby, |i| {
        rb_self.core().parked_count(&key_bytes, i)
    })
}

/// The entries (JSON) of the jobs parked on `key`, `limit` at most.
fn parked_entries(
    ruby: &Ruby,
    rb_self: &NativeLocker,
    key: RString,
    limit: usize,
) -> Result<RArray, Error> {
    let key_bytes = copy_bytes(key);
    let to_ruby = |e| errors::for_key(ruby, e, key);
    let entries = blocking(ruby, to_ruby, |i| {
        rb_self.core().parked_entries(&key_bytes, limit, i)
    })?;
    Ok(ruby.ary_from_iter(entries.iter().map(|entry| ruby.str_from_slice(entry))))
}

/// Takes the job `token` out of `key`'s line: true when it was there.
fn delete_parked(
    ruby: &Ruby,
    rb_self: &NativeLocker,
    key: RString,
    token: String,
) -> Result<bool, Error> {
    let key_bytes = copy_bytes(key);
    let to_ruby = |e| errors::for_key(ruby, e, key);
    blocking(ruby, to_ruby, |i| {
        rb_self.core().delete_parked(&key_bytes, &token, i)
    })
}

/// `Native::Lock#release`, handing the lock to the first job parked on it.
fn release_parked(ruby: &Ruby, rb_self: &NativeLock) -> Result<bool, Error> {
    let lock = rb_self.held();
    let to_ruby = |e| errors::for_key_bytes(ruby, e, lock.key());
    blocking(ruby, to_ruby, |i| lock.release_parked(i))
}
