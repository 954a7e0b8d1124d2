//! How long a blocking acquire waits between two attempts.
//!
//! While releases reach this process (`subscriber.rs`), a waiter sleeps until it is woken, until
//! the holder's TTL runs out, or for `RECHECK` at most (it renews its place in the queue that
//! often). Otherwise it backs off with jitter, as a plain polling client would.

use std::sync::LazyLock;
use std::time::Duration;

/// How long a queued waiter keeps its place without renewing it: a waiter whose process died
/// frees the line after this, and a lock handed to it is taken back after this.
pub const HEARTBEAT: Duration = Duration::from_millis(2_000);

/// `HEARTBEAT` in ms, as the scripts take it (rendered once: the release and queue scripts and
/// every acquire's undo pass it).
pub static HEARTBEAT_MS: LazyLock<String> = LazyLock::new(|| HEARTBEAT.as_millis().to_string());

/// The longest a waiter sleeps while it listens for releases.
pub const RECHECK: Duration = Duration::from_millis(500);

/// The next pause: until woken, or `retry_in` (the holder's remaining TTL) when listening;
/// the jittered backoff when not.
pub fn next_pause(listening: bool, retry_in: Option<Duration>, backoff: &mut Backoff) -> Duration {
    if listening {
        retry_in.unwrap_or(RECHECK).min(RECHECK)
    } else {
        backoff.next_pause()
    }
}

/// Whether a lock handed to a waiter that asks for `ttl` lives less than that. A release that
/// hands it over, and a queued attempt of the waiter's own (a copy of which Redis may run after
/// the waiter gave up), grant it `HEARTBEAT` at most: a waiter that died or left meanwhile holds
/// the line no longer than its place in the queue would have lasted. The waiter extends such a
/// lock to `ttl` before it counts as taken (`LockCore::extend_handed`).
pub fn handoff_is_short(ttl: Duration) -> bool {
    ttl > HEARTBEAT
}

/// The first pause: short, so a lock released soon after is taken almost at once.
const FIRST_STEP: Duration = Duration::from_millis(2);

/// Exponential backoff with jitter, capped at the `retry_interval` setting. The jitter keeps
/// waiters that started together from retrying in lockstep.
pub struct Backoff {
    step: Duration,
    cap: Duration,
}

impl Backoff {
    pub fn new(cap: Duration) -> Self {
        Backoff {
            step: FIRST_STEP.min(cap),
            cap,
        }
    }

    /// The next pause: between half and all of the current step; the step doubles up to the cap.
    pub fn next_pause(&mut self) -> Duration {
        let step = self.step;
        self.step = (step * 2).min(self.cap);
        let half = step / 2;
        half + half.mul_f64(fastrand::f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_small_doubles_and_stays_under_the_cap() {
        let mut backoff = Backoff::new(Duration::from_millis(100));
        let first = backoff.next_pause();
        assert!(first >= Duration::from_millis(1) && first <= FIRST_STEP);
        let pauses: Vec<Duration> = (0..20).map(|_| backoff.next_pause()).collect();
        assert!(pauses.iter().all(|p| *p <= Duration::from_millis(100)));
        assert!(pauses[10..].iter().all(|p| *p >= Duration::from_millis(50)));
    }

    #[test]
    fn only_a_ttl_above_the_heartbeat_outlives_a_hand_off() {
        assert!(handoff_is_short(Duration::from_secs(30)));
        assert!(handoff_is_short(HEARTBEAT + Duration::from_millis(1)));
        // Granted the TTL the waiter asked for: nothing to extend.
        assert!(!handoff_is_short(HEARTBEAT));
        assert!(!handoff_is_short(Duration::from_millis(500)));
    }

    #[test]
    fn listening_waiters_sleep_until_the_ttl_runs_out_or_recheck() {
        let mut backoff = Backoff::new(Duration::from_secs(1));
        let soon = Some(Duration::from_millis(30));
        assert_eq!(
            next_pause(true, soon, &mut backoff),
            Duration::from_millis(30)
        );
        assert_eq!(
            next_pause(true, Some(Duration::from_secs(9)), &mut backoff),
            RECHECK
        );
        assert_eq!(next_pause(true, None, &mut backoff), RECHECK);
        assert!(next_pause(false, soon, &mut backoff) <= FIRST_STEP);
    }

    #[test]
    fn a_cap_below_the_first_step_wins() {
        let mut backoff = Backoff::new(Duration::from_micros(500));
        assert!((0..10).all(|_| backoff.next_pause() <= Duration::from_micros(500)));
    }
}
