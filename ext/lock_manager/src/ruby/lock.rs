//! `LockManager::Native::Lock`: the held lock a Ruby `LockManager::Lock` holds (and, for a block
//! that renews its lock, what its `Result` asks whether the lock was lost).

use magnus::{method, prelude::*, Error, RModule, Ruby};

use crate::lock::Lock;
use crate::ruby::call::blocking;
use crate::ruby::errors;

#[magnus::wrap(class = "LockManager::Native::Lock", free_immediately, size)]
pub struct NativeLock(Lock);

impl From<Lock> for NativeLock {
    fn from(lock: Lock) -> Self {
        NativeLock(lock)
    }
}

pub fn init(ruby: &Ruby, native: RModule) -> Result<(), Error> {
    let class = native.define_class("Lock", ruby.class_object())?;
    class.undef_default_alloc_func();
    class.define_method("token", method!(NativeLock::token, 0))?;
    class.define_method("fencing_token", method!(NativeLock::fencing_token, 0))?;
    class.define_method("lost?", method!(NativeLock::is_lost, 0))?;
    class.define_method("owned?", method!(NativeLock::is_owned, 0))?;
    class.define_method("refresh", method!(NativeLock::refresh, 1))?;
    class.define_method("release", method!(NativeLock::release, 0))?;
    class.define_method("keep", method!(NativeLock::keep, 1))?;
    Ok(())
}

impl NativeLock {
    pub fn held(&self) -> &Lock {
        &self.0
    }

    fn token(&self) -> String {
        self.0.token().to_owned()
    }

    fn fencing_token(&self) -> u64 {
        self.0.fencing_token()
    }

    fn is_lost(&self) -> bool {
        self.0.is_lost()
    }

    fn is_owned(ruby: &Ruby, rb_self: &Self) -> Result<bool, Error> {
        let lock = &rb_self.0;
        let to_ruby = |e| errors::for_key_bytes(ruby, e, lock.key());
        blocking(ruby, to_ruby, |i| lock.is_owned(i))
    }

    fn refresh(ruby: &Ruby, rb_self: &Self, ttl_ms: u64) -> Result<bool, Error> {
        let lock = &rb_self.0;
        let to_ruby = |e| errors::for_key_bytes(ruby, e, lock.key());
        blocking(ruby, to_ruby, |i| lock.refresh(ttl_ms, i))
    }

    fn keep(ruby: &Ruby, rb_self: &Self, ttl_ms: u64) -> Result<bool, Error> {
        let lock = &rb_self.0;
        let to_ruby = |e| errors::for_key_bytes(ruby, e, lock.key());
        blocking(ruby, to_ruby, |i| lock.keep(ttl_ms, i))
    }

    fn release(ruby: &Ruby, rb_self: &Self) -> Result<bool, Error> {
        let lock = &rb_self.0;
        let to_ruby = |e| errors::for_key_bytes(ruby, e, lock.key());
        blocking(ruby, to_ruby, |i| lock.release(i))
    }
}
