//! The seam with Ruby: the objects the extension defines under `LockManager::Native`, and the
//! conversion of errors into the gem's exceptions. Nothing outside this module touches Ruby
//! (but for `gvl.rs`, which releases its lock).

pub mod admin;
pub mod call;
pub mod claims;
pub mod errors;
pub mod lease_events;
pub mod limiter;
pub mod lock;
pub mod locker;
pub mod parking;
