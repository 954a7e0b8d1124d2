//! `LockManager::Native::Locker`: the object a Ruby `LockManager::Locker` holds, around one
//! `LockCore` (one pool, one key prefix).
//!
//! Arguments arrive checked and converted by the Ruby layer (`lib/lock_manager/arguments.rb`);
//! every Redis round trip and every wait runs without the GVL.

use std::sync::Arc;
use std::time::{Duration, Instant};

use magnus::{
    function, method, prelude::*, Error, IntoValue, RHash, RModule, RString, Ruby, TryConvert,
    Value,
};

use crate::connector::{self, Tls};
use crate::gvl;
use crate::held::Owner;
use crate::keys;
use crate::lock::Lock;
use crate::lock_core::{Acquisition, Claim, LockCore, LockSettings, Replication};
use crate::pool::{PoolSettings, Topology};
use crate::request::Request;
use crate::ruby::call::{blocking, copy_bytes, current_thread, request};
use crate::ruby::errors;
use crate::ruby::lock::NativeLock;
use crate::token;

#[magnus::wrap(class = "LockManager::Native::Locker", free_immediately, size)]
pub struct NativeLocker {
    core: Arc<LockCore>,
}

pub fn init(ruby: &Ruby, native: RModule) -> Result<(), Error> {
    let class = native.define_class("Locker", ruby.class_object())?;
    class.define_singleton_method("new", function!(NativeLocker::new, 1))?;
    class.define_method("synchronize", method!(NativeLocker::synchronize, 6))?;
    class.define_method("lock", method!(NativeLocker::lock, 5))?;
    class.define_method("locked?", method!(NativeLocker::is_locked, 1))?;
    class.define_method("pool_state", method!(NativeLocker::pool_state, 0))?;
    let policy = method!(NativeLocker::maxmemory_policy, 0);
    class.define_method("maxmemory_policy", policy)?;
    native.define_module_function("key_prefix_problem", function!(key_prefix_problem, 1))?;
    native.define_module_function("url_problem", function!(url_problem, 1))?;
    native.define_module_function("new_token", function!(new_token, 1))?;
    native.define_module_function("quote_key", function!(quote_key, 1))?;
    Ok(())
}

/// The `tls` entry Ruby adds to the settings (`Arguments::Tls.material`): nil, or a Hash of PEM
/// Strings `ca`, `cert` and `key` (each may be nil) and `verify`.
fn tls(ruby: &Ruby, value: Value) -> Result<Tls, Error> {
    let Some(hash) = Option::<RHash>::try_convert(value)? else {
        return Ok(Tls::default());
    };
    let pem = |name: &str| -> Result<Option<Vec<u8>>, Error> {
        let value: Option<RString> = hash.fetch(ruby.to_symbol(name))?;
        Ok(value.map(copy_bytes))
    };
    let client = pem("cert")?.zip(pem("key")?);
    Ok(Tls::new(
        pem("ca")?,
        client,
        hash.fetch(ruby.to_symbol("verify"))?,
    ))
}

/// Why the redis crate cannot use `url`, or nil (the reason never quotes the URL).
fn url_problem(url: String) -> Option<String> {
    connector::parse_url(&url).err()
}

/// Why `prefix` cannot be a key prefix (it would reach the gem's own keys), or nil.
fn key_prefix_problem(prefix: RString) -> Option<String> {
    keys::prefix_problem(unsafe { prefix.as_slice() })
}

/// A token of the calling thread, now, as an acquisition writes it (the testing mode's locks
/// carry the same).
fn new_token(limit: u32) -> String {
    token::new_token(limit)
}

/// `key` quoted as the extension's messages quote it.
fn quote_key(key: RString) -> String {
    errors::quote_key(unsafe { key.as_slice() })
}

/// What `synchronize` did, as Ruby receives it: nil (taken by another; the block did not run),
/// true (released after the block), false (lost while the block ran), or `[held, problem]` when
/// the release after the block failed (the lock then expires by its TTL).
pub enum Outcome {
    Taken,
    Released { held: bool },
    ReleaseFailed { held: bool, problem: String },
}

impl IntoValue for Outcome {
    fn into_value_with(self, ruby: &Ruby) -> Value {
        match self {
            Outcome::Taken => ruby.qnil().as_value(),
            Outcome::Released { held } => held.into_value_with(ruby),
            Outcome::ReleaseFailed { held, problem } => (held, problem).into_value_with(ruby),
        }
    }
}

impl NativeLocker {
    pub fn core(&self) -> &Arc<LockCore> {
        &self.core
    }

    /// `settings`: the Hash `Configuration.check` returned, every rule checked there.
    fn new(ruby: &Ruby, settings: RHash) -> Result<NativeLocker, Error> {
        let core = LockCore::new(lock_settings(ruby, settings)?);
        core.map(|core| NativeLocker {
            core: Arc::new(core),
        })
        .map_err(|e| errors::unkeyed(ruby, e))
    }

    /// Runs the block while holding the lock (see `Outcome`). The block receives the fencing
    /// token, the lock itself when it is renewed (nil otherwise: its `lost?` turns true as soon
    /// as the renewal finds out), and `contended`: true when the first attempt found the lock
    /// held (or, `fair`, another waiter queued ahead), so that it was taken after waiting
    /// (`Acquisition::contended`; known from the replies, no command of its own). `wait`:
    /// seconds, or nil for one attempt. `renewal`: false, true (until released) or the cap in ms.
    /// (Ruby's arguments, positional to spare a Hash per call, become one `Request` on the first
    /// line.)
    #[allow(clippy::too_many_arguments)]
    fn synchronize(
        ruby: &Ruby,
        rb_self: &Self,
        key: RString,
        ttl_ms: u64,
        wait: Option<f64>,
        limit: u32,
        fair: bool,
        renewal: Value,
    ) -> Result<Outcome, Error> {
        let request = request(ttl_ms, wait, limit, fair, renewal)?;
        let thread = current_thread(ruby);
        let Some((key_bytes, token, acquired)) =
            acquire(ruby, &rb_self.core, key, &request, thread)?
        else {
            return Ok(Outcome::Taken);
        };
        let contended = acquired.contended;
        let lock = Lock::new(&rb_self.core, key_bytes, token, acquired, request, thread);
        let fencing_token = lock.fencing_token();
        // Released whatever the block did; the Ruby layer rescues the block's exceptions to
        // re-raise them after it has seen this outcome (throw, break and Thread#kill pass).
        if !request.renewal.is_on() {
            let ran = ruby.yield_values::<_, Value>((fencing_token, ruby.qnil(), contended));
            let outcome = finish(&lock);
            return ran.map(|_| outcome);
        }
        let shown = ruby.obj_wrap(NativeLock::from(lock));
        let ran = ruby.yield_values::<_, Value>((fencing_token, shown, contended));
        let outcome = finish(shown.held());
        ran.map(|_| outcome)
    }

    /// A lock handle: one attempt (`wait` nil: nil when taken), or waiting up to `wait` seconds
    /// (raises LockNotAcquired).
    fn lock(
        ruby: &Ruby,
        rb_self: &Self,
        key: RString,
        ttl_ms: u64,
        wait: Option<f64>,
        fair: bool,
        renewal: Value,
    ) -> Result<Option<NativeLock>, Error> {
        let request = request(ttl_ms, wait, 1, fair, renewal)?;
        let thread = current_thread(ruby);
        let Some((key_bytes, token, acquired)) =
            acquire(ruby, &rb_self.core, key, &request, thread)?
        else {
            return Ok(None);
        };
        let lock = Lock::new(&rb_self.core, key_bytes, token, acquired, request, thread);
        // An interrupt already pending would raise as soon as we return: release first, so the
        // exception does not leak the lock.
        if let Err(interrupt) = ruby.thread_check_ints() {
            let _ = gvl::without_gvl_to_completion(|i| lock.release(i));
            return Err(interrupt);
        }
        Ok(Some(NativeLock::from(lock)))
    }

    fn is_locked(ruby: &Ruby, rb_self: &Self, key: RString) -> Result<bool, Error> {
        let key_bytes = copy_bytes(key);
        let to_ruby = |e| errors::for_key(ruby, e, key);
        blocking(ruby, to_ruby, |i| rb_self.core.locked(&key_bytes, i))
    }

    /// Redis's `maxmemory-policy` once this process has connected (nil before; "" when Redis
    /// would not say).
    fn maxmemory_policy(&self) -> Option<String> {
        self.core.pool().maxmemory_policy()
    }

    /// `[open, idle]` connections of this process's pool: for leak checks.
    fn pool_state(&self) -> (u32, u32) {
        self.core.pool().state()
    }
}

/// Releases the lock after its block; whether it was held to the end. A release that fails
/// cannot change what the block did: it comes back for the Ruby layer to log, never raised over
/// the block's own outcome. A child forked inside the block leaves its parent's lock alone.
fn finish(lock: &Lock) -> Outcome {
    if !lock.is_here() {
        return Outcome::Released { held: true };
    }
    let released = gvl::without_gvl_to_completion(|i| lock.release(i));
    let lost_by_renewal = lock.is_lost();
    match released {
        Ok(held) => Outcome::Released {
            held: held && !lost_by_renewal,
        },
        Err(error) => Outcome::ReleaseFailed {
            held: !lost_by_renewal, // otherwise unknown: the lock expires by its TTL
            problem: format!("{error}; the lock expires after its timeout"),
        },
    }
}

/// Acquires `key` for `request`: once (no wait: `None` when taken) or waiting until its
/// deadline. Each attempt after a Ruby interrupt that raised nothing (Thread#wakeup) gets a fresh
/// token: the undo of an attempt cut short may still reach Redis, and must not release a later
/// one. Returns the key's bytes, the token and the acquisition.
fn acquire(
    ruby: &Ruby,
    core: &LockCore,
    key: RString,
    request: &Request,
    thread: Owner,
) -> Result<Option<(Vec<u8>, String, Acquisition)>, Error> {
    let key_bytes = copy_bytes(key);
    let to_ruby = |e| errors::for_key(ruby, e, key);
    if !request.is_shared() {
        core.held()
            .check_not_held(&key_bytes, thread)
            .map_err(to_ruby)?;
    }
    let started = Instant::now();
    let deadline = request.deadline(started);
    let mut token = String::new();
    let acquired = blocking(ruby, to_ruby, |interrupt| {
        token = token::new_token(request.limit);
        let claim = Claim {
            key: &key_bytes,
            token: &token,
            request: *request,
        };
        match deadline {
            None => core
                .try_acquire(&claim, interrupt)
                .map(|taken| taken.map(Acquisition::for_claimed_ttl)),
            Some(deadline) => core
                .acquire_until(&claim, started, deadline, interrupt)
                .map(Some),
        }
    })?;
    Ok(acquired.map(|mut acquired| {
        let token = acquired.new_token.take().unwrap_or(token);
        (key_bytes, token, acquired)
    }))
}

/// A Locker's settings, read from the Hash of `Configuration.check` (symbol keys, every value of
/// the type and range its check ensures; it lets through one topology at most, and sentinels only
/// with their master).
fn lock_settings(ruby: &Ruby, settings: RHash) -> Result<LockSettings, Error> {
    let get = |name: &str| settings.fetch::<_, Value>(ruby.to_symbol(name));
    let seconds = |name: &str| -> Result<Duration, Error> {
        let value = f64::try_convert(get(name)?)?;
        Duration::try_from_secs_f64(value)
            .map_err(|e| Error::new(ruby.exception_type_error(), format!("{name}: {e}")))
    };
    let (sentinels, cluster) = (get("sentinels")?, get("cluster")?);
    let topology = match (
        Option::<Vec<String>>::try_convert(cluster)?,
        sentinels.is_nil(),
    ) {
        (Some(seeds), _) => Topology::Cluster { seeds },
        (None, false) => Topology::Sentinel {
            sentinels: TryConvert::try_convert(sentinels)?,
            master: TryConvert::try_convert(get("sentinel_master")?)?,
        },
        (None, true) => Topology::Standalone,
    };
    Ok(LockSettings {
        pool: PoolSettings {
            redis_url: TryConvert::try_convert(get("redis_url")?)?,
            topology,
            pool_size: TryConvert::try_convert(get("pool_size")?)?,
            pool_timeout: seconds("pool_timeout")?,
            connect_timeout: seconds("connect_timeout")?,
            read_timeout: seconds("read_timeout")?,
            tls: tls(ruby, get("tls")?)?,
        },
        key_prefix: copy_bytes(TryConvert::try_convert(get("key_prefix")?)?),
        retry_interval: seconds("retry_interval")?,
        replication: Some(Replication {
            replicas: TryConvert::try_convert(get("min_replicas")?)?,
            timeout: seconds("replica_timeout")?,
        }),
    })
}
