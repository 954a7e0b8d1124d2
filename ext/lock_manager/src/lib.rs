//! Native core of the lock_manager gem. This file declares the modules and has each Ruby-facing
//! one register itself under `LockManager::Native`.

mod admin;
pub mod claims;
mod connector;
mod error;
mod gvl;
mod held;
mod keys;
mod lease_events;
mod limits;
mod lock;
mod lock_core;
mod parking;
mod per_process;
mod pool;
mod renewal;
mod replies;
mod request;
mod router;
mod ruby;
pub mod scripts;
mod subscriber;
mod token;
mod transport;
mod wait;
mod waker;

pub use claims::{ClaimRequest, Claimed};
pub use connector::Tls;
pub use error::LockError;
pub use gvl::Interrupt;
pub use keys::KeySpace;
pub use lock::Lock;
pub use lock_core::{Acquisition, Claim, LockCore, LockSettings, Replication};
pub use parking::{ParkRequest, Parked};
pub use pool::{PoolSettings, Topology};
pub use request::{Renewal, Request};

use magnus::{prelude::*, Error, Ruby};

#[magnus::init]
fn init(ruby: &Ruby) -> Result<(), Error> {
    gvl::init();
    let lock_manager = ruby.define_module("LockManager")?;
    let native = lock_manager.define_module("Native")?;
    ruby::errors::init(lock_manager)?;
    ruby::locker::init(ruby, native)?;
    ruby::lock::init(ruby, native)?;
    ruby::limiter::init(ruby, native)?;
    ruby::claims::init(native)?;
    ruby::parking::init(native)?;
    ruby::lease_events::init(native)?;
    ruby::admin::init(ruby, native)?;
    Ok(())
}
