//! The r2d2 pool of Redis connections, built on the `redis` crate's own r2d2 support.
//!
//! `redis::Client` implements `r2d2::ManageConnection`, but connects without a timeout and
//! cannot tell a healthy connection from one whose last command timed out (redis-rs keeps such
//! a connection open and skips the late reply). `Manager` wraps it to add the connect and read
//! timeouts and a `poisoned` flag: a connection that timed out or was interrupted mid-command
//! is dropped, never handed to the next caller.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use r2d2::ManageConnection;
use redis::{ConnectionLike, RedisError};
use scheduled_thread_pool::ScheduledThreadPool;

use crate::connector::{Connector, Tls};
use crate::error::LockError;
use crate::gvl::{self, Interrupt};
use crate::per_process::PerProcess;
use crate::replies::{broken, is_authentication, is_permission, is_signalled, tls_failure};

/// How often a waiting checkout looks at its interrupt flag.
const CHECKOUT_SLICE: Duration = Duration::from_millis(10);

/// How often a checkout that asked for a connection looks whether one is idle yet.
const CONNECT_POLL: Duration = Duration::from_millis(2);

/// The longest pause between r2d2's background retries of a connect that failed: once Redis is
/// back, callers wait this long at most for the pool to reach it again.
const RECONNECT_PAUSE: Duration = Duration::from_millis(500);

/// How often a call cut short by a signal that was not meant for it is tried again.
pub const STRAY_SIGNAL_RETRIES: u32 = 2;

/// Threads that open connections for every pool of the process (r2d2 would start 3 per pool).
const CONNECTOR_THREADS: usize = 2;

#[derive(Clone, Debug)]
pub struct PoolSettings {
    pub redis_url: String,
    pub topology: Topology,
    pub pool_size: u32,
    pub pool_timeout: Duration,
    pub connect_timeout: Duration,
    pub read_timeout: Duration,
    pub tls: Tls,
}

/// Which Redis set-up a Locker talks to (see `router.rs`).
#[derive(Clone, Debug, Default)]
pub enum Topology {
    /// `redis_url`'s server.
    #[default]
    Standalone,
    /// The primary of `master`, as these sentinels (URLs) name it; `redis_url` gives its
    /// credentials, database and TLS.
    Sentinel {
        sentinels: Vec<String>,
        master: String,
    },
    /// A Redis Cluster, found from these seed nodes (URLs, with the nodes' credentials).
    Cluster { seeds: Vec<String> },
}

/// A pooled Redis connection and what we learnt about it.
pub struct Conn {
    pub redis: redis::Connection,
    /// Set after a timeout, an interrupt or a protocol surprise: drop instead of reuse.
    pub poisoned: bool,
    /// The connector's generation when it was opened (see `Connector::generation`).
    generation: u64,
    /// A TLS connection: its round trips run with signals held (`gvl::with_signals_held`).
    tls: bool,
}

impl Conn {
    /// Runs `io` on the connection; on a TLS one, with signals held.
    pub fn run<T>(&mut self, io: impl FnOnce(&mut redis::Connection) -> T) -> T {
        gvl::with_signals_held(self.tls, || io(&mut self.redis))
    }
}

/// Whether Redis answered our last connection attempt.
#[derive(Default)]
struct Health {
    failed_connects: AtomicU64,
    /// How many of `failed_connects` a waiting checkout has reported: each failed connect is
    /// reported to one caller, not to every thread waiting for a connection.
    reported_failures: AtomicU64,
    down: AtomicBool,
    /// Why the last connection attempt failed, and how.
    last_failure: Mutex<(String, ConnectFailure)>,
    /// Checkouts waiting for a connection right now.
    waiting: AtomicU32,
    /// Redis's `maxmemory-policy`, read on the first checkout ("" when Redis would not say).
    maxmemory_policy: OnceLock<String>,
}

#[derive(Clone, Copy, PartialEq, Default)]
enum ConnectFailure {
    #[default]
    Unreachable,
    /// Redis accepted the connection but did not answer the handshake in time.
    TimedOut,
    /// Redis refused our credentials: r2d2's background retries stop asking it (see `connect`).
    Refused,
    /// The TLS handshake failed (`tls_failure`): not asked again in the background either.
    Tls,
    /// The Redis user may not run a command of the connection's set-up (SELECT): nor this.
    Denied,
}

pub struct Manager {
    connector: Connector,
    connect_timeout: Duration,
    read_timeout: Duration,
    health: Arc<Health>,
}

impl ManageConnection for Manager {
    type Connection = Conn;
    type Error = RedisError;

    fn connect(&self) -> Result<Conn, RedisError> {
        // r2d2 retries a failed connect in the background, forever. With wrong credentials that
        // only fills Redis's ACL log: only a caller waiting for a connection makes us ask again.
        if self.health.waiting.load(Ordering::Acquire) == 0 && self.last_failure_was_refused() {
            return Err(RedisError::from((
                redis::ErrorKind::AuthenticationFailed,
                "credentials or certificate refused; not retried in the background",
            )));
        }
        let mut connected = self.connect_once();
        // r2d2's own threads are never interrupted on purpose: EINTR there is a stray signal
        // (SIGCHLD from any child process), not a reason to report Redis as down.
        for _ in 0..STRAY_SIGNAL_RETRIES {
            match &connected {
                Err(error) if is_signalled(error) => connected = self.connect_once(),
                _ => break,
            }
        }
        match &connected {
            Ok(_) => self.health.down.store(false, Ordering::Release),
            Err(error) => {
                if let Ok(mut last) = self.health.last_failure.lock() {
                    *last = if is_authentication(error) {
                        (error.to_string(), ConnectFailure::Refused)
                    } else if is_permission(error) {
                        (error.to_string(), ConnectFailure::Denied)
                    } else if let Some(cause) = tls_failure(error) {
                        (cause, ConnectFailure::Tls)
                    } else if error.is_timeout() {
                        let timeout = self.connect_timeout.as_secs_f64();
                        let cause = format!("no answer within connect_timeout ({timeout:.3}s)");
                        (cause, ConnectFailure::TimedOut)
                    } else {
                        (error.to_string(), ConnectFailure::Unreachable)
                    };
                }
                self.health.down.store(true, Ordering::Release);
                self.health.failed_connects.fetch_add(1, Ordering::AcqRel);
            }
        }
        connected.map(|(redis, generation)| Conn {
            redis,
            poisoned: false,
            generation,
            tls: self.connector.is_tls(),
        })
    }

    fn is_valid(&self, conn: &mut Conn) -> Result<(), RedisError> {
        redis::cmd("PING").query(&mut conn.redis)
    }

    fn has_broken(&self, conn: &mut Conn) -> bool {
        conn.poisoned || !conn.redis.is_open() || conn.generation != self.connector.generation()
    }
}

impl Manager {
    fn last_failure_was_refused(&self) -> bool {
        self.health.last_failure.lock().is_ok_and(|last| {
            matches!(
                last.1,
                ConnectFailure::Refused | ConnectFailure::Tls | ConnectFailure::Denied
            )
        })
    }

    fn connect_once(&self) -> Result<(redis::Connection, u64), RedisError> {
        let generation = self.connector.generation();
        let redis = self.connector.connect(self.connect_timeout)?;
        redis.set_read_timeout(Some(self.read_timeout))?;
        redis.set_write_timeout(Some(self.read_timeout))?;
        Ok((redis, generation))
    }
}

/// The pool of one process. A forked child must never use its parent's sockets or threads.
struct ProcessPool {
    pool: r2d2::Pool<Manager>,
    health: Arc<Health>,
}

pub type PooledConn = r2d2::PooledConnection<Manager>;

pub struct Pool {
    settings: PoolSettings,
    connector: Connector,
    current: PerProcess<ProcessPool>,
}

impl Pool {
    /// Sets the pool up; connects lazily, on first checkout.
    pub fn new(settings: PoolSettings, connector: Connector) -> Pool {
        Pool {
            settings,
            connector,
            current: PerProcess::new(),
        }
    }

    pub fn connector(&self) -> &Connector {
        &self.connector
    }

    /// `host:port` (or the socket path, or the Sentinel primary): for messages; it never
    /// carries a password.
    pub fn addr(&self) -> String {
        self.connector.describe()
    }

    pub fn settings(&self) -> &PoolSettings {
        &self.settings
    }

    /// The pool of the current process: built on first use, and again after fork.
    fn process_pool(&self) -> Arc<ProcessPool> {
        self.current
            .get_or_create(|| build(&self.settings, &self.connector))
            .0
    }

    /// A connection from the pool: at once when one is idle, else waiting (interruptibly) up to
    /// `pool_timeout`. Fails with `Connection` as soon as Redis refuses new connections.
    pub fn checkout(&self, interrupt: &Interrupt) -> Result<PooledConn, LockError> {
        let process = self.process_pool();
        let mut conn = self.checkout_from(&process, interrupt)?;
        while conn.generation != self.connector.generation() {
            conn.poisoned = true;
            drop(conn);
            conn = self.checkout_from(&process, interrupt)?;
        }
        if process.health.maxmemory_policy.get().is_none() {
            self.learn_maxmemory_policy(&process.health, &mut conn)?;
        }
        Ok(conn)
    }

    /// On this process's first checkout: Redis's `maxmemory-policy`, on the caller's connection
    /// (a round trip once per process and pool, never per lock cycle).
    fn learn_maxmemory_policy(
        &self,
        health: &Health,
        conn: &mut PooledConn,
    ) -> Result<(), LockError> {
        match conn.run(read_maxmemory_policy) {
            Ok(policy) => {
                let _ = health.maxmemory_policy.set(policy);
                Ok(())
            }
            Err(error) => {
                conn.poisoned = true;
                // A signal cut it short: back to Ruby, which raises or resumes the call.
                match is_signalled(&error) {
                    true => Err(LockError::Interrupted),
                    false => Err(broken(
                        &self.addr(),
                        &error,
                        self.settings.read_timeout,
                        false,
                    )),
                }
            }
        }
    }

    fn checkout_from(
        &self,
        process: &ProcessPool,
        interrupt: &Interrupt,
    ) -> Result<PooledConn, LockError> {
        if let Some(conn) = process.pool.try_get() {
            return Ok(conn);
        }
        let started = Instant::now();
        let deadline = started + self.settings.pool_timeout;
        let failures_before = process.health.failed_connects.load(Ordering::Acquire);
        let _waiting = WaitingCheckout::count(&process.health);
        let mut asked = None;
        loop {
            interrupt.check()?;
            let slice = CHECKOUT_SLICE.min(deadline.saturating_duration_since(Instant::now()));
            if let Some(conn) = next_connection(&process.pool, slice, &mut asked) {
                return Ok(conn);
            }
            let waited = started.elapsed();
            let failed_for_us = process.health.take_failure_since(failures_before);
            let known_down = process.health.down.load(Ordering::Acquire)
                && waited >= self.settings.connect_timeout;
            if failed_for_us || known_down {
                return Err(self.connect_error(&process.health));
            }
            if Instant::now() >= deadline {
                return Err(LockError::PoolTimeout {
                    waited,
                    size: self.settings.pool_size,
                });
            }
        }
    }

    /// Why connecting failed: a refusal of our credentials, or Redis being unreachable.
    fn connect_error(&self, health: &Health) -> LockError {
        let (cause, failure) = health
            .last_failure
            .lock()
            .map(|last| last.clone())
            .unwrap_or_else(|_| ("connection failed".into(), ConnectFailure::Unreachable));
        let addr = self.addr();
        match failure {
            ConnectFailure::Refused => LockError::Authentication { addr, cause },
            ConnectFailure::Tls => LockError::Tls { addr, cause },
            ConnectFailure::Denied => LockError::Permission { addr, reply: cause },
            _ => LockError::Connection {
                addr,
                cause,
                timed_out: failure == ConnectFailure::TimedOut,
                undone: false,
            },
        }
    }

    /// Redis's `maxmemory-policy` ("" when it would not say), once this process has connected.
    pub fn maxmemory_policy(&self) -> Option<String> {
        self.process_pool().health.maxmemory_policy.get().cloned()
    }

    /// Connections open in this process and how many of them are idle.
    pub fn state(&self) -> (u32, u32) {
        let state = self.process_pool().pool.state();
        (state.connections, state.idle_connections)
    }
}

fn build(settings: &PoolSettings, connector: &Connector) -> ProcessPool {
    let health = Arc::new(Health::default());
    let manager = Manager {
        connector: connector.clone(),
        connect_timeout: settings.connect_timeout,
        read_timeout: settings.read_timeout,
        health: Arc::clone(&health),
    };
    let pool = r2d2::Pool::builder()
        .max_size(settings.pool_size)
        .min_idle(Some(0))
        // r2d2 uses it only for `get()`, which we never call (checkouts keep their own deadline,
        // pool_timeout), and to cap its reconnect backoff at half of it.
        .connection_timeout(RECONNECT_PAUSE * 2)
        // A PING per checkout would double the cost of a lock; broken connections show
        // themselves on use and are replaced then.
        .test_on_check_out(false)
        .error_handler(Box::new(r2d2::NopErrorHandler))
        .thread_pool(connector_threads())
        .build_unchecked(manager);
    ProcessPool { pool, health }
}

/// The process's connector threads; a forked child starts its own (threads do not survive fork).
fn connector_threads() -> Arc<ScheduledThreadPool> {
    static CONNECTORS: PerProcess<ScheduledThreadPool> = PerProcess::new();
    let create = || {
        ScheduledThreadPool::builder()
            .num_threads(CONNECTOR_THREADS)
            .thread_name_pattern("lock_manager-connect-{}")
            .build()
    };
    CONNECTORS.get_or_create(create).0
}

impl Health {
    /// Claims one connect that failed after `since` (a count of `failed_connects`) and that no
    /// other checkout has reported yet.
    fn take_failure_since(&self, since: u64) -> bool {
        let failed = self.failed_connects.load(Ordering::Acquire);
        self.reported_failures
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |reported| {
                let next = reported.max(since) + 1;
                (next <= failed).then_some(next)
            })
            .is_ok()
    }
}

/// Waits up to `slice` for a connection. r2d2 starts a connect on every `get_timeout` while the
/// pool holds fewer than `pool_size`: a checkout asks for one, then waits for it (or a checkin)
/// without asking again until a connection opens, so one slow handshake does not become
/// `pool_size` of them. `asked`: how many connections the pool held when this checkout asked.
fn next_connection(
    pool: &r2d2::Pool<Manager>,
    slice: Duration,
    asked: &mut Option<u32>,
) -> Option<PooledConn> {
    let connections = pool.state().connections;
    let room = connections < pool.max_size();
    if room && asked.is_some_and(|held| connections <= held) {
        std::thread::sleep(CONNECT_POLL.min(slice));
        return pool.try_get();
    }
    *asked = room.then_some(connections);
    pool.get_timeout(slice).ok()
}

/// Counts a checkout as waiting while it lives.
struct WaitingCheckout<'a>(&'a Health);

impl<'a> WaitingCheckout<'a> {
    fn count(health: &'a Health) -> Self {
        health.waiting.fetch_add(1, Ordering::AcqRel);
        WaitingCheckout(health)
    }
}

impl Drop for WaitingCheckout<'_> {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::AcqRel);
    }
}

/// `CONFIG GET maxmemory-policy`; "" when Redis refuses it (managed services rename or forbid
/// CONFIG). An I/O error fails the connection it was read on.
fn read_maxmemory_policy(redis: &mut redis::Connection) -> Result<String, RedisError> {
    let reply = redis::cmd("CONFIG")
        .arg("GET")
        .arg("maxmemory-policy")
        .query::<Vec<String>>(redis);
    match reply {
        Ok(pair) => Ok(pair.get(1).cloned().unwrap_or_default()),
        Err(error) if error.code().is_some() => Ok(String::new()),
        Err(error) => Err(error),
    }
}
