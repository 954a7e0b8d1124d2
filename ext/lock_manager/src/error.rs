//! Everything that can go wrong in the lock core, as plain Rust data.
//!
//! The core never builds Ruby objects: `ruby_errors.rs` turns these into the
//! gem's exception classes once the GVL is held again.

use std::fmt;
use std::time::Duration;

#[derive(Debug, Clone, PartialEq)]
pub enum LockError {
    /// Redis could not be reached, dropped the connection, or (`timed_out`) did not answer in time.
    /// `undone`: the command's reply never came and its undo was sent after it.
    Connection {
        addr: String,
        cause: String,
        timed_out: bool,
        undone: bool,
    },
    /// Redis answered, but cannot serve a lock right now (see `Unavailable`).
    Unavailable {
        addr: String,
        reply: String,
        reason: Unavailable,
    },
    /// `redis_url` points at a Redis Cluster node (MOVED, ASK, CROSSSLOT).
    Cluster { addr: String, reply: String },
    /// Redis refused our credentials (WRONGPASS, NOAUTH): retrying will not help.
    Authentication { addr: String, cause: String },
    /// The TLS handshake failed (a certificate not trusted, expired, for another name, or
    /// missing): retrying will not help.
    Tls { addr: String, cause: String },
    /// The Redis user may not run our commands on these keys (NOPERM).
    Permission { addr: String, reply: String },
    /// Redis is out of memory and refuses writes (OOM).
    OutOfMemory { addr: String, reply: String },
    /// Every pooled connection stayed checked out for the whole `pool_timeout`.
    PoolTimeout { waited: Duration, size: u32 },
    /// Fewer than `min_replicas` replicas acknowledged an acquisition within `replica_timeout`:
    /// it was undone.
    NotReplicated {
        addr: String,
        needed: u32,
        reached: u32,
        timeout: Duration,
        /// What was written and undone.
        write: Written,
    },
    /// The lock stayed held by someone else until the deadline passed.
    NotAcquired { waited: Duration },
    /// The calling thread already holds this plain lock through this Locker: waiting for it
    /// would wait for itself.
    AlreadyHeld,
    /// Redis answered with an error reply (WRONGTYPE, OOM, NOPERM, ...).
    Server { addr: String, reply: String },
    /// A Ruby interrupt (Thread#raise, Thread#kill, a signal) arrived: Ruby decides what happens next.
    Interrupted,
    /// A caller broke a precondition the Ruby layer is meant to enforce.
    Argument(String),
    /// A bug in the extension (a caught panic); never unwinds into Ruby.
    Internal(String),
}

/// Why Redis cannot serve a lock right now.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Unavailable {
    /// A replica (READONLY), or one that lost its primary (MASTERDOWN).
    ReadOnly,
    /// Loading its data set after a restart (LOADING).
    Loading,
    /// A Cluster that cannot serve the key's slot now (CLUSTERDOWN, TRYAGAIN).
    ClusterDown,
    /// It has as many clients as `maxclients` allows.
    TooManyClients,
}

/// What a write that `min_replicas` undid had done (for `NotReplicated`'s message).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    /// A lock taken, or a limiter's units.
    Lock,
    /// A job parked on a lock (`parking.rs`).
    ParkedJob,
}

impl LockError {
    pub fn connection(addr: &str, cause: impl fmt::Display) -> Self {
        LockError::Connection {
            addr: addr.to_owned(),
            cause: cause.to_string(),
            timed_out: false,
            undone: false,
        }
    }

    /// A failure that may pass by itself (Redis unreachable, slow, restarting, failing over, its
    /// connections all busy): a blocking wait with time left goes on through it.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            LockError::Connection { .. }
                | LockError::Unavailable { .. }
                | LockError::PoolTimeout { .. }
                | LockError::NotReplicated { .. }
        )
    }

    /// Whether an undo was sent after the command that failed: its token must not be used again.
    pub fn undo_sent(&self) -> bool {
        matches!(self, LockError::Connection { undone: true, .. })
    }
}

impl fmt::Display for LockError {
    /// The message a user reads, one arm per error: longer than 60 lines, kept whole so that the
    /// messages read alike.
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
            LockError::Tls { addr, cause } => {
                write!(f, "TLS with Redis at {addr} failed: {cause}")
            }
            LockError::Permission { addr, reply } => {
                write!(
                    f,
                    "the Redis user of redis_url may not lock here ({addr}): {reply}"
                )?;
                // Redis 7.0 names neither the command nor the key a script was refused, nor the
                // key of a refused command (7.2 does, quoted: 'incr', 'lock:k').
                if reply.matches('\'').count() < 2 {
                    write!(
                        f,
                        " (Redis's ACL LOG names what it refused; docs/acl.md has the rules lock_manager needs)"
                    )?;
                }
                Ok(())
            }
            LockError::OutOfMemory { addr, reply } => {
                write!(f, "Redis at {addr} is out of memory: {reply}")
            }
            LockError::Unavailable {
                addr,
                reply,
                reason,
            } => match reason {
                Unavailable::ReadOnly => write!(
                    f,
                    "Redis at {addr} is a replica, not the primary: {reply} \
                     (point redis_url at the primary)"
                ),
                Unavailable::Loading => {
                    write!(f, "Redis at {addr} is loading its data set: {reply}")
                }
                Unavailable::ClusterDown => {
                    write!(
                        f,
                        "the Redis Cluster at {addr} cannot serve this key now: {reply}"
                    )
                }
                Unavailable::TooManyClients => write!(
                    f,
                    "Redis at {addr} refuses more clients: {reply} \
                     (raise its maxclients, or lower pool_size)"
                ),
            },
            LockError::Cluster { addr, reply } => write!(
                f,
                "Redis at {addr} is a Redis Cluster node: {reply} \
                 (to lock on a Redis Cluster, give its node URLs as `cluster`)"
            ),
            LockError::PoolTimeout { waited, size } => write!(
                f,
                "no free Redis connection within {:.3}s: all {size} pooled connections are in use \
                 (raise pool_size or pool_timeout)",
                waited.as_secs_f64()
            ),
            LockError::AlreadyHeld => write!(
                f,
                "already held by this thread through this Locker (a plain lock is not re-entrant; \
                 limit: N counts each acquisition as a permit)"
            ),
            LockError::NotReplicated {
                addr,
                needed,
                reached,
                timeout,
                write,
            } => {
                let (done, undone) = match write {
                    Written::Lock => ("acquired", "released again, not granted"),
                    Written::ParkedJob => ("a job parked", "taken out of the line again"),
                };
                write!(
                    f,
                    "{done} on {addr}, but {reached} of the {needed} replicas (min_replicas) \
                     acknowledged it within replica_timeout ({:.3}s): {undone}",
                    timeout.as_secs_f64()
                )
            }
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
