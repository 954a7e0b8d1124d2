//! The lock algorithm: SET NX PX with a unique token to acquire, compare-and-delete to release.

use std::time::{Duration, Instant};

use redis::RedisError;

use crate::error::LockError;
use crate::gvl::Interrupt;
use crate::pool::{is_signalled, Pool, PoolSettings, STRAY_SIGNAL_RETRIES};
use crate::scripts::{ACQUIRE, ACQUIRE_SHARED, REFRESH, RELEASE};
use crate::wait::Backoff;

pub struct LockSettings {
    pub pool: PoolSettings,
    pub key_prefix: Vec<u8>,
    pub retry_interval: Duration,
}

pub struct LockCore {
    pool: Pool,
    key_prefix: Vec<u8>,
    retry_interval: Duration,
}

/// Why a round trip failed, as far as the connection is concerned.
enum Failure {
    /// The connection died (reset, EOF, broken pipe): a fresh one may well work.
    Dropped(RedisError),
    /// A signal that was not for us (SIGCHLD from any child process, say: Ruby's handlers do
    /// not restart system calls) cut the command short: worth retrying on a fresh connection.
    Signalled(RedisError),
    /// Ruby interrupted the thread mid-command.
    Interrupted,
    /// No usable answer: timeout, garbled reply. Whether the command ran is unknown.
    Unusable(RedisError),
    /// Redis answered with an error reply; the connection itself is fine.
    Refused(RedisError),
}

impl LockCore {
    pub fn new(settings: LockSettings) -> Result<LockCore, LockError> {
        Ok(LockCore {
            pool: Pool::new(settings.pool)?,
            key_prefix: settings.key_prefix,
            retry_interval: settings.retry_interval,
        })
    }

    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    pub fn redis_key(&self, key: &[u8]) -> Vec<u8> {
        [self.key_prefix.as_slice(), key].concat()
    }

    /// One attempt, one round trip: true when `token` now holds the lock for `ttl_ms`, as one
    /// of at most `limit` holders (1: the plain lock).
    pub fn try_acquire(
        &self,
        key: &[u8],
        token: &str,
        ttl_ms: u64,
        limit: u32,
        interrupt: &Interrupt,
    ) -> Result<bool, LockError> {
        let redis_key = self.redis_key(key);
        let ttl = ttl_ms.to_string();
        let limit_arg = limit.to_string();
        let mut sent = false;
        let acquired = self.round_trip(interrupt, |conn, attempt| {
            sent = true;
            if limit > 1 {
                ACQUIRE_SHARED
                    .run::<i64>(
                        conn,
                        &redis_key,
                        &[token.as_bytes(), ttl.as_bytes(), limit_arg.as_bytes()],
                    )
                    .map(|taken| taken == 1)
            } else if attempt == 0 {
                redis::cmd("SET")
                    .arg(&redis_key)
                    .arg(token)
                    .arg("NX")
                    .arg("PX")
                    .arg(ttl_ms)
                    .query::<Option<String>>(conn)
                    .map(|reply| reply.is_some())
            } else {
                // The first SET may have reached Redis before the connection died.
                ACQUIRE
                    .run::<i64>(conn, &redis_key, &[token.as_bytes(), ttl.as_bytes()])
                    .map(|taken| taken == 1)
            }
        });
        if sent && acquired == Err(LockError::Interrupted) {
            // The SET may have landed just as the interrupt came: never leave that lock behind.
            let _ = self.release(key, token, limit, &Interrupt::for_current_thread());
        }
        acquired
    }

    /// Retries with backoff until `token` holds the lock or `deadline` passes. `started` is when
    /// the caller began waiting, for the `waited` figure of `NotAcquired`.
    #[allow(clippy::too_many_arguments)]
    pub fn acquire_until(
        &self,
        key: &[u8],
        token: &str,
        ttl_ms: u64,
        limit: u32,
        started: Instant,
        deadline: Instant,
        interrupt: &Interrupt,
    ) -> Result<(), LockError> {
        let mut backoff = Backoff::new(self.retry_interval);
        loop {
            if self.try_acquire(key, token, ttl_ms, limit, interrupt)? {
                return Ok(());
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(LockError::NotAcquired {
                    waited: now - started,
                });
            }
            interrupt.sleep_until((now + backoff.next_pause()).min(deadline))?;
        }
    }

    /// Deletes the lock (or this holder's slot, for `limit` > 1) if `token` still holds it;
    /// false when it expired or changed hands.
    pub fn release(
        &self,
        key: &[u8],
        token: &str,
        limit: u32,
        interrupt: &Interrupt,
    ) -> Result<bool, LockError> {
        let redis_key = self.redis_key(key);
        self.round_trip(interrupt, |conn, _| {
            if limit > 1 {
                redis::cmd("ZREM")
                    .arg(&redis_key)
                    .arg(token)
                    .query::<i64>(conn)
            } else {
                RELEASE.run::<i64>(conn, &redis_key, &[token.as_bytes()])
            }
            .map(|deleted| deleted == 1)
        })
    }

    /// Resets the TTL to `ttl_ms` if `token` still holds the lock.
    pub fn refresh(
        &self,
        key: &[u8],
        token: &str,
        ttl_ms: u64,
        interrupt: &Interrupt,
    ) -> Result<bool, LockError> {
        let redis_key = self.redis_key(key);
        let ttl = ttl_ms.to_string();
        self.round_trip(interrupt, |conn, _| {
            REFRESH
                .run::<i64>(conn, &redis_key, &[token.as_bytes(), ttl.as_bytes()])
                .map(|renewed| renewed == 1)
        })
    }

    /// Whether `token` holds the lock right now.
    pub fn owned(&self, key: &[u8], token: &str, interrupt: &Interrupt) -> Result<bool, LockError> {
        let redis_key = self.redis_key(key);
        self.round_trip(interrupt, |conn, _| {
            redis::cmd("GET")
                .arg(&redis_key)
                .query::<Option<Vec<u8>>>(conn)
                .map(|holder| holder.as_deref() == Some(token.as_bytes()))
        })
    }

    /// Whether anyone holds the lock right now.
    pub fn locked(&self, key: &[u8], interrupt: &Interrupt) -> Result<bool, LockError> {
        let redis_key = self.redis_key(key);
        self.round_trip(interrupt, |conn, _| {
            redis::cmd("EXISTS")
                .arg(&redis_key)
                .query::<i64>(conn)
                .map(|n| n == 1)
        })
    }

    /// Runs `command` on a pooled connection. After a dropped connection it retries once on
    /// another, and keeps retrying while it only meets pooled connections that went stale
    /// (Redis restarted since they were last used), at most once per pooled connection.
    fn round_trip<T>(
        &self,
        interrupt: &Interrupt,
        mut command: impl FnMut(&mut redis::Connection, u32) -> Result<T, RedisError>,
    ) -> Result<T, LockError> {
        let retry_limit = self.pool.settings().pool_size + 1;
        let mut attempt = 0;
        let mut stray_signals = 0;
        loop {
            let mut conn = self.pool.checkout(interrupt)?;
            interrupt.check()?;
            let error = match command(&mut conn.redis, attempt) {
                Ok(value) => {
                    conn.reused = true;
                    return Ok(value);
                }
                Err(error) => error,
            };
            let failure = classify(error, interrupt);
            conn.poisoned = !matches!(failure, Failure::Refused(_));
            match failure {
                Failure::Dropped(_) if attempt == 0 || (conn.reused && attempt < retry_limit) => {
                    attempt += 1;
                }
                Failure::Signalled(_) if stray_signals < STRAY_SIGNAL_RETRIES => {
                    stray_signals += 1;
                    attempt += 1;
                }
                Failure::Dropped(error) | Failure::Signalled(error) | Failure::Unusable(error) => {
                    return Err(self.connection_error(&error));
                }
                Failure::Interrupted => return Err(LockError::Interrupted),
                Failure::Refused(error) => {
                    return Err(LockError::Server {
                        addr: self.pool.addr().to_owned(),
                        reply: error.to_string(),
                    })
                }
            }
        }
    }

    fn connection_error(&self, error: &RedisError) -> LockError {
        let cause = if error.is_timeout() {
            format!(
                "no reply within read_timeout ({:.3}s)",
                self.pool.settings().read_timeout.as_secs_f64()
            )
        } else {
            error.to_string()
        };
        LockError::connection(self.pool.addr(), cause)
    }
}

fn classify(error: RedisError, interrupt: &Interrupt) -> Failure {
    let signalled = is_signalled(&error);
    if signalled && interrupt.is_raised() {
        Failure::Interrupted
    } else if signalled {
        Failure::Signalled(error)
    } else if error.is_timeout() {
        Failure::Unusable(error)
    } else if error.is_connection_dropped() {
        Failure::Dropped(error)
    } else if error.is_io_error() || error.kind() == redis::ErrorKind::Parse {
        Failure::Unusable(error)
    } else {
        Failure::Refused(error)
    }
}
