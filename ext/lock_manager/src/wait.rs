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

/// A lock handed over by a release is taken on the word of the release's message only while
/// the attempt that queued its waiter was sent less than this share of the hand-off's TTL ago:
/// the lock then stays valid for at least the rest. Otherwise the waiter confirms with a round
/// trip, which also resets the TTL.
const TRUSTED_SHARE_OF_HANDOFF: u32 = 2;

/// Whether a waiter may take a lock handed to it on the release's word alone.
#[derive(Debug, PartialEq)]
pub enum HandedOver {
    /// Too long since the attempt that queued it: an attempt must confirm.
    Confirm,
    /// Taken. A release hands the lock over with a TTL of at most `HEARTBEAT`: when that is
    /// shorter than the waiter's own TTL, `expires_early` says how long after the queueing
    /// attempt it runs out unless extended (`renewal.rs` extends it).
    Trusted { expires_early: Option<Duration> },
}

/// Judges a hand-off to a waiter asking for `ttl`, whose queueing attempt was sent
/// `since_queued` ago.
pub fn judge_handoff(ttl: Duration, since_queued: Duration) -> HandedOver {
    let handoff_ttl = ttl.min(HEARTBEAT);
    if since_queued >= handoff_ttl / TRUSTED_SHARE_OF_HANDOFF {
        return HandedOver::Confirm;
    }
    HandedOver::Trusted {
        expires_early: (handoff_ttl < ttl).then_some(handoff_ttl),
    }
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
    fn a_recent_hand_off_is_trusted_and_extended_when_its_ttl_is_short() {
        let recent = Duration::from_millis(100);
        assert_eq!(
            judge_handoff(Duration::from_secs(30), recent),
            HandedOver::Trusted {
                expires_early: Some(HEARTBEAT)
            }
        );
        // A TTL under the hand-off's: the lock already has the TTL the waiter asked for.
        assert_eq!(
            judge_handoff(Duration::from_millis(500), recent),
            HandedOver::Trusted {
                expires_early: None
            }
        );
    }

    #[test]
    fn a_hand_off_too_long_after_queueing_is_confirmed() {
        assert_eq!(
            judge_handoff(Duration::from_secs(30), HEARTBEAT / 2),
            HandedOver::Confirm
        );
        assert_eq!(
            judge_handoff(Duration::from_millis(500), Duration::from_millis(250)),
            HandedOver::Confirm
        );
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
