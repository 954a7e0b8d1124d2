//! The claims of `LockManager::Native::Locker` (see `claims.rs`): the enqueue locks of unique
//! jobs, held by the job's id from push to start or finish, whichever process runs it.

use magnus::{method, prelude::*, Error, IntoValue, RArray, RClass, RModule, RString, Ruby, Value};

use crate::claims::{ClaimRequest, Claimed};
use crate::error::LockError;
use crate::gvl::Interrupt;
use crate::lock::Lock;
use crate::lock_core::{Acquisition, Claim};
use crate::ruby::call::{blocking, copy_bytes, copy_keys, current_thread, request};
use crate::ruby::errors;
use crate::ruby::lock::NativeLock;
use crate::ruby::locker::NativeLocker;

pub fn init(native: RModule) -> Result<(), Error> {
    let class: RClass = native.const_get("Locker")?;
    class.define_method("claim", method!(claim, 3))?;
    class.define_method("claim_push", method!(claim_push, 5))?;
    class.define_method("server_identity", method!(server_identity, 0))?;
    class.define_method("adopt", method!(adopt, 5))?;
    class.define_method("holder", method!(holder, 1))?;
    class.define_method("release_claim", method!(release_claim, 2))?;
    class.define_method("release_claims", method!(release_claims, 2))?;
    Ok(())
}

/// Claims `keys[i]` for `tokens[i]` for `ttls_ms[i]` (one round trip on one Redis). Returns, for
/// each, its fencing token (an Integer) when the token holds the lock now, else the holder's
/// token (a String).
fn claim(
    ruby: &Ruby,
    rb_self: &NativeLocker,
    keys: RArray,
    tokens: Vec<String>,
    ttls_ms: Vec<u64>,
) -> Result<RArray, Error> {
    if keys.len() != tokens.len() || keys.len() != ttls_ms.len() {
        return Err(Error::new(
            ruby.exception_arg_error(),
            "claim: as many tokens and TTLs as keys",
        ));
    }
    claiming(ruby, keys, &tokens, &ttls_ms, |claims, i| {
        rb_self.core().claim_all(claims, i)
    })
}

/// `claim`, where each claim taken also pushes its job: `pushes[i]` is that job's push, commands
/// of Strings `[name, key, args...]` (see `claims.rs`, `claim_and_push`).
fn claim_push(
    ruby: &Ruby,
    rb_self: &NativeLocker,
    keys: RArray,
    tokens: Vec<String>,
    ttls_ms: Vec<u64>,
    pushes: RArray,
    replacing: Option<Vec<bool>>,
) -> Result<RArray, Error> {
    let replacing = replacing.unwrap_or_default();
    let pushes = pushes
        .into_iter()
        .map(|push| {
            RArray::try_convert(push)?
                .into_iter()
                .map(copy_command)
                .collect()
        })
        .collect::<Result<Vec<Vec<_>>, Error>>()?;
    if keys.len() != tokens.len() || keys.len() != ttls_ms.len() || keys.len() != pushes.len() {
        return Err(Error::new(
            ruby.exception_arg_error(),
            "claim_push: as many tokens, TTLs and pushes as keys",
        ));
    }
    if pushes.iter().flatten().any(|command| command.len() < 2) {
        let message = "claim_push: a push command is its name and its key at least";
        return Err(Error::new(ruby.exception_arg_error(), message));
    }
    claiming(ruby, keys, &tokens, &ttls_ms, |claims, i| {
        rb_self
            .core()
            .claim_and_push(claims, &pushes, &replacing, i)
    })
}

/// The Redis the locks live on, "run_id/db", or nil on a Cluster (see `claims.rs`).
fn server_identity(ruby: &Ruby, rb_self: &NativeLocker) -> Result<Option<String>, Error> {
    let to_ruby = |e| errors::for_subject(ruby, e, &"the identity of the locks' Redis");
    blocking(ruby, to_ruby, |i| rb_self.core().server_identity(i))
}

/// One push command, `[name, key, args...]`, as bytes.
fn copy_command(command: Value) -> Result<Vec<Vec<u8>>, Error> {
    copy_keys(RArray::try_convert(command)?)
}

/// Runs `call` with the claims of `keys[i]` for `tokens[i]` for `ttls_ms[i]`, the GVL released;
/// each reply as `claim` returns it. An error names the first key.
fn claiming(
    ruby: &Ruby,
    keys: RArray,
    tokens: &[String],
    ttls_ms: &[u64],
    mut call: impl FnMut(&[ClaimRequest], &Interrupt) -> Result<Vec<Claimed>, LockError>,
) -> Result<RArray, Error> {
    let key_bytes = copy_keys(keys)?;
    let claims = requests(&key_bytes, tokens, ttls_ms);
    let first = key_bytes.first().cloned().unwrap_or_default();
    let to_ruby = |e| errors::for_key_bytes(ruby, e, &first);
    let claimed = blocking(ruby, to_ruby, |i| call(&claims, i))?;
    Ok(ruby.ary_from_iter(claimed.into_iter().map(|c| shown(ruby, c))))
}

fn requests<'a>(
    keys: &'a [Vec<u8>],
    tokens: &'a [String],
    ttls_ms: &[u64],
) -> Vec<ClaimRequest<'a>> {
    (0..keys.len())
        .map(|at| ClaimRequest {
            key: &keys[at],
            token: &tokens[at],
            ttl_ms: ttls_ms[at],
        })
        .collect()
}

/// Takes over the claim `token` holds on `key` (or takes the lock, when free) for this process,
/// renewed like any lock: the job's lock while it runs. Returns the lock, or the holder's token
/// when another holds it. With `limit` > 1, a permit of the semaphore `key`: the one handed to
/// `token` (a parked job's), or a free one; nil when every permit is taken.
fn adopt(
    ruby: &Ruby,
    rb_self: &NativeLocker,
    key: RString,
    token: String,
    ttl_ms: u64,
    limit: u32,
    renewal: Value,
) -> Result<Value, Error> {
    let request = request(ttl_ms, None, limit, false, renewal)?;
    let key_bytes = copy_bytes(key);
    let core = rb_self.core();
    let to_ruby = |e| errors::for_key(ruby, e, key);
    let thread = current_thread(ruby);
    let claimed = if request.is_shared() {
        // A semaphore's permit: renewed when `token` holds it, else taken when one is free.
        let claim = Claim {
            key: &key_bytes,
            token: &token,
            request,
        };
        match blocking(ruby, to_ruby, |i| core.try_acquire(&claim, i))? {
            Some(fencing_token) => Claimed::Taken(fencing_token),
            None => return Ok(ruby.qnil().as_value()),
        }
    } else {
        core.held()
            .check_not_held(&key_bytes, thread)
            .map_err(to_ruby)?;
        let claims = [ClaimRequest {
            key: &key_bytes,
            token: &token,
            ttl_ms,
        }];
        // One claim asked, one answered.
        blocking(ruby, to_ruby, |i| core.claim_all(&claims, i))?.remove(0)
    };
    match claimed {
        Claimed::Taken(fencing_token) => {
            let acquired = Acquisition::for_claimed_ttl(fencing_token);
            let lock = Lock::new(core, key_bytes, token, acquired, request, thread);
            Ok(ruby.obj_wrap(NativeLock::from(lock)).as_value())
        }
        held => Ok(shown(ruby, held)),
    }
}

/// The token that holds `key` now, or nil.
fn holder(ruby: &Ruby, rb_self: &NativeLocker, key: RString) -> Result<Option<RString>, Error> {
    let key_bytes = copy_bytes(key);
    let to_ruby = |e| errors::for_key(ruby, e, key);
    let holder = blocking(ruby, to_ruby, |i| rb_self.core().holder(&key_bytes, i))?;
    Ok(holder.map(|token| ruby.str_from_slice(&token)))
}

/// Releases `key` if `token` holds it (a pending job deleted, a job that died): true if it did.
fn release_claim(
    ruby: &Ruby,
    rb_self: &NativeLocker,
    key: RString,
    token: String,
) -> Result<bool, Error> {
    let key_bytes = copy_bytes(key);
    let to_ruby = |e| errors::for_key(ruby, e, key);
    blocking(ruby, to_ruby, |i| {
        rb_self.core().release(&key_bytes, &token, 1, i)
    })
}

/// Releases each `keys[i]` that `tokens[i]` holds (pending jobs removed in bulk), in one round
/// trip on one Redis: per key, true if it did. An error names the first key.
fn release_claims(
    ruby: &Ruby,
    rb_self: &NativeLocker,
    keys: RArray,
    tokens: Vec<String>,
) -> Result<Vec<bool>, Error> {
    if keys.len() != tokens.len() {
        return Err(Error::new(
            ruby.exception_arg_error(),
            "release_claims: as many tokens as keys",
        ));
    }
    let key_bytes = copy_keys(keys)?;
    let claims: Vec<(&[u8], &str)> = key_bytes
        .iter()
        .map(Vec::as_slice)
        .zip(tokens.iter().map(String::as_str))
        .collect();
    let first = key_bytes.first().cloned().unwrap_or_default();
    let to_ruby = |e| errors::for_key_bytes(ruby, e, &first);
    blocking(ruby, to_ruby, |i| rb_self.core().release_all(&claims, i))
}

fn shown(ruby: &Ruby, claimed: Claimed) -> Value {
    match claimed {
        Claimed::Taken(fencing_token) => fencing_token.into_value_with(ruby),
        Claimed::HeldBy(holder) => ruby.str_from_slice(&holder).as_value(),
        Claimed::Replaced(fencing_token, replaced) => ruby
            .ary_new_from_values(&[
                fencing_token.into_value_with(ruby),
                ruby.str_from_slice(&replaced).as_value(),
            ])
            .as_value(),
    }
}
