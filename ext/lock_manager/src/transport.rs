//! How a command reaches Redis and what its failures become: a pooled connection of the node that
//! serves its key, a connection found dead replaced and the command sent again, a reply cut short
//! undone on the same connection, MOVED followed, a Cluster slot that migrates or fails over asked
//! again after a pause, and every other failure classified into a `LockError` naming the node.
//! What to send, and what its reply means, is the caller's (`lock_core`, `claims`, `admin`).

use std::time::{Duration, Instant};

use redis::{RedisError, RedisResult};

use crate::error::LockError;
use crate::gvl::Interrupt;
use crate::pool::{Pool, STRAY_SIGNAL_RETRIES};
use crate::replies::{broken, classify, cluster_redirect, refusal, Failure, Redirect};
use crate::router::Router;

/// How often a round trip follows MOVED before it gives up (each one updates the slot map).
const MOVED_LIMIT: u32 = 5;
/// Pause before asking again a Cluster slot that is migrating (ASK, TRYAGAIN) or failing over.
const CLUSTER_RETRY_PAUSE: Duration = Duration::from_millis(20);

/// What undoes a command whose reply was cut short (an interrupt, a timeout), since it may
/// still run: it writes the undo on the same connection (see `LuaScript::send_after`).
pub(crate) type Undo<'a> = &'a dyn Fn(&mut redis::Connection);

/// What one round trip has tried so far.
#[derive(Default)]
struct Tries {
    /// What the command is told of its earlier sends.
    sent: Sent,
    dropped: u32,
    stray_signals: u32,
    moved: u32,
    /// When a Cluster slot asked again stops being asked (`cluster_pause`).
    cluster_deadline: Option<Instant>,
}

/// What a round trip tells its command about earlier sends of it.
#[derive(Clone, Copy, Default)]
pub(crate) struct Sent {
    /// An earlier send may have run before its reply was lost.
    pub(crate) resent: bool,
    /// The key's Cluster slot is migrating (or was failing over): send one command, not a
    /// pipeline of several.
    pub(crate) migrating: bool,
}

impl Router {
    /// Runs `command` on a pooled connection of the node that serves `route` (a full Redis key:
    /// every key a command touches lies in its slot). A connection found dead before any reply
    /// (EOF, reset, broken pipe) is replaced and the command sent again, as often as the pool
    /// has connections, plus once: every command here is safe to repeat with the same token.
    /// When the reply was cut short (interrupt, timeout) the command may still run: `undo` is
    /// then sent on the same connection, so that Redis runs it after the command, never before.
    /// On a Cluster, MOVED is followed (and the slot map updated); a slot that is migrating
    /// (ASK, TRYAGAIN) or failing over (CLUSTERDOWN, a node gone) is asked again after a pause,
    /// for up to `read_timeout`. ASK is not followed: a lock's keys would then be split between
    /// two nodes (a fencing counter made anew on the importing one); Redis runs the commands of
    /// a slot again once its migration ends.
    pub(crate) fn round_trip<T>(
        &self,
        route: &[u8],
        interrupt: &Interrupt,
        undo: Option<Undo>,
        mut command: impl FnMut(&mut redis::Connection, Sent) -> Result<T, RedisError>,
    ) -> Result<T, LockError> {
        let mut tries = Tries::default();
        loop {
            let pool = self.pool_for(route)?;
            let mut conn = match pool.checkout(interrupt) {
                Err(error) if self.is_cluster() && error.is_transient() => {
                    // A node gone: its replica may be taking over.
                    self.topology_changed();
                    self.cluster_pause(&mut tries.cluster_deadline, interrupt, error)?;
                    continue;
                }
                checked_out => checked_out?,
            };
            interrupt.check()?;
            let sent = tries.sent;
            let error = match conn.run(|redis| command(redis, sent)) {
                Ok(value) => return Ok(value),
                Err(error) => error,
            };
            let failure = classify(error, undo.is_some(), interrupt.takes_signals_to_ruby());
            conn.poisoned = !failure.keeps_connection();
            if let (Failure::Interrupted | Failure::Unusable(_), Some(undo)) = (&failure, undo) {
                conn.run(undo);
            }
            drop(conn);
            let addr = pool.addr();
            self.try_again(failure, &mut tries, route, &addr, undo.is_some(), interrupt)?;
        }
    }

    /// What follows a failed send: `Ok` to send again (after a pause, for a Cluster slot that
    /// migrates or fails over), else the error it comes to. `undone`: an undo was sent after it.
    fn try_again(
        &self,
        failure: Failure,
        tries: &mut Tries,
        route: &[u8],
        addr: &str,
        undone: bool,
        interrupt: &Interrupt,
    ) -> Result<(), LockError> {
        match failure {
            // Any pooled connection may have died while idle (a restart, CLIENT KILL, a server
            // or load balancer timeout), used before or not.
            Failure::Dropped(_) if tries.dropped <= self.settings().pool_size => {
                tries.dropped += 1;
                tries.sent.resent = true;
                if self.is_cluster() {
                    self.topology_changed();
                }
                Ok(())
            }
            Failure::Signalled(_) if tries.stray_signals < STRAY_SIGNAL_RETRIES => {
                tries.stray_signals += 1;
                tries.sent.resent = true;
                Ok(())
            }
            Failure::Dropped(error) | Failure::Signalled(error) => {
                Err(self.connection_error(addr, &error, false))
            }
            Failure::Unusable(error) => Err(self.connection_error(addr, &error, undone)),
            Failure::Interrupted => Err(LockError::Interrupted),
            Failure::Refused(error) if self.is_cluster() => match cluster_redirect(&error) {
                Some(Redirect::Moved(node)) if tries.moved < MOVED_LIMIT => {
                    tries.moved += 1;
                    self.moved(route, node);
                    Ok(())
                }
                Some(Redirect::Moved(_)) | None => Err(refusal(addr, &error)),
                Some(redirect @ (Redirect::Migrating | Redirect::Down)) => {
                    tries.sent.migrating = true;
                    if redirect == Redirect::Down {
                        self.topology_changed();
                    }
                    let refused = refusal(addr, &error);
                    self.cluster_pause(&mut tries.cluster_deadline, interrupt, refused)
                }
            },
            Failure::Refused(error) => Err(refusal(addr, &error)),
        }
    }

    /// A pause before a Cluster slot is asked again; `error` once `read_timeout` has passed
    /// since the first pause.
    fn cluster_pause(
        &self,
        deadline: &mut Option<Instant>,
        interrupt: &Interrupt,
        error: LockError,
    ) -> Result<(), LockError> {
        let now = Instant::now();
        let deadline = *deadline.get_or_insert(now + self.settings().read_timeout);
        if now >= deadline {
            return Err(error);
        }
        interrupt.sleep_until((now + CLUSTER_RETRY_PAUSE).min(deadline))
    }

    /// `undone`: an undo of the command was sent after it.
    fn connection_error(&self, addr: &str, error: &RedisError, undone: bool) -> LockError {
        broken(addr, error, self.settings().read_timeout, undone)
    }
}

/// Runs `command` on a connection of `pool` (one node), replacing a connection that died while
/// idle as `Router::round_trip` does; for commands about no one key (SCAN).
pub(crate) fn on_node<T>(
    pool: &Pool,
    interrupt: &Interrupt,
    mut command: impl FnMut(&mut redis::Connection) -> RedisResult<T>,
) -> Result<T, LockError> {
    let retry_limit = pool.settings().pool_size + 1;
    let mut retries = 0;
    loop {
        let mut conn = pool.checkout(interrupt)?;
        interrupt.check()?;
        let error = match conn.run(&mut command) {
            Ok(value) => return Ok(value),
            Err(error) => error,
        };
        let failure = classify(error, false, interrupt.takes_signals_to_ruby());
        conn.poisoned = !failure.keeps_connection();
        drop(conn);
        match failure {
            Failure::Dropped(_) | Failure::Signalled(_) if retries < retry_limit => retries += 1,
            Failure::Interrupted => return Err(LockError::Interrupted),
            Failure::Refused(error) => return Err(refusal(&pool.addr(), &error)),
            Failure::Dropped(error) | Failure::Signalled(error) | Failure::Unusable(error) => {
                let read_timeout = pool.settings().read_timeout;
                return Err(broken(&pool.addr(), &error, read_timeout, false));
            }
        }
    }
}
