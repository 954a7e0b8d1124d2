//! Everything that can go wrong in the lock core, as plain Rust data.
//!
//! The core never builds Ruby objects: `ruby_errors.rs` turns these into the
//! gem's exception classes once the GVL is held again.

use std::fmt;
use std::time::Duration;

#[derive(Debug, Clone, PartialEq)]
pub enum LockError {
    /// Redis could not be reached, dropped the connection, or (`timed_out`) did not answer in time.
    Connection {
        addr: String,
        cause: String,
        timed_out: bool,
    },
    /// Redis refused our credentials (WRONGPASS, NOAUTH): retrying will not help.
    Authentication { addr: String, cause: String },
    /// The Redis user may not run our commands on these keys (NOPERM).
    Permission { addr: String, reply: String },
    /// Redis is out of memory and refuses writes (OOM).
    OutOfMemory { addr: String, reply: String },
    /// Every pooled connection stayed checked out for the whole `pool_timeout`.
    PoolTimeout { waited: Duration, size: u32 },
    /// The lock stayed held by someone else until the deadline passed.
    NotAcquired { waited: Duration },
    /// Redis answered with an error reply (WRONGTYPE, OOM, NOPERM, ...).
    Server { addr: String, reply: String },
    /// A Ruby interrupt (Thread#raise, Thread#kill, a signal) arrived: Ruby decides what happens next.
    Interrupted,
    /// A caller broke a precondition the Ruby layer is meant to enforce.
    Argument(String),
    /// A bug in the extension (a caught panic); never unwinds into Ruby.
    Internal(String),
}

impl LockError {
    pub fn connection(addr: &str, cause: impl fmt::Display) -> Self {
        LockError::Connection {
            addr: addr.to_owned(),
            cause: cause.to_string(),
            timed_out: false,
        }
    }
}

impl fmt::Display for LockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LockError::Connection { addr, cause, .. } => {
                write!(f, "cannot talk to Redis at {addr}: {cause}")
            }
            LockError::Authentication { addr, cause } => {
                write!(
                    f,
                    "Redis at {addr} refused the credentials of redis_url: {cause}"
                )
            }
            LockError::Permission { addr, reply } => {
                write!(
                    f,
                    "the Redis user of redis_url may not lock here ({addr}): {reply}"
                )
            }
            LockError::OutOfMemory { addr, reply } => {
                write!(f, "Redis at {addr} is out of memory: {reply}")
            }
            LockError::PoolTimeout { waited, size } => write!(
                f,
                "no free Redis connection within {:.3}s: all {size} pooled connections are in use \
                 (raise pool_size or pool_timeout)",
                waited.as_secs_f64()
            ),
            LockError::NotAcquired { waited } => {
                write!(f, "lock still held after {:.3}s", waited.as_secs_f64())
            }
            LockError::Server { addr, reply } => write!(f, "Redis at {addr} refused: {reply}"),
            LockError::Interrupted => write!(f, "interrupted"),
            LockError::Argument(message) => write!(f, "{message}"),
            LockError::Internal(message) => write!(f, "internal error in lock_manager: {message}"),
        }
    }
}

impl std::error::Error for LockError {}
