//! Native core of the lock_manager gem. This file only registers the Ruby class.

mod error;
mod gvl;
mod lock;
mod locker;
mod per_process;
mod pool;
mod renewal;
mod ruby_errors;
pub mod scripts;
mod subscriber;
mod wait;

pub use error::LockError;
pub use gvl::Interrupt;
pub use lock::{Acquisition, Claim, LockCore, LockSettings};
pub use pool::PoolSettings;

use magnus::{function, method, prelude::*, Error, Ruby};

#[magnus::init]
fn init(ruby: &Ruby) -> Result<(), Error> {
    gvl::init();
    let lock_manager = ruby.define_module("LockManager")?;
    let class = lock_manager.define_class("Locker", ruby.class_object())?;
    class.define_singleton_method("native_new", function!(locker::Locker::build, 7))?;
    class.define_method(
        "native_synchronize",
        method!(locker::Locker::synchronize, 7),
    )?;
    class.define_method(
        "native_try_acquire",
        method!(locker::Locker::try_acquire, 4),
    )?;
    class.define_method("native_acquire", method!(locker::Locker::acquire, 6))?;
    class.define_method("native_release", method!(locker::Locker::release, 2))?;
    class.define_method("native_refresh", method!(locker::Locker::refresh, 3))?;
    class.define_method("native_owned", method!(locker::Locker::owned, 2))?;
    class.define_method("native_locked", method!(locker::Locker::locked, 1))?;
    class.define_method("pool_state", method!(locker::Locker::pool_state, 0))?;
    let lease = lock_manager.define_class("Lease", ruby.class_object())?;
    lease.undef_default_alloc_func();
    lease.define_method("lost?", method!(locker::Lease::is_lost, 0))?;
    lease.define_method("stop", method!(locker::Lease::stop, 0))?;
    Ok(())
}
