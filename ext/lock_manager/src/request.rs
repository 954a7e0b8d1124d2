//! What one lock call asks for, carried whole through acquire, the lock's delivery to Ruby and
//! the start of its lease.

use std::time::{Duration, Instant};

/// How a lock is kept alive while held.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Renewal {
    /// It lives its TTL, then expires.
    Off,
    /// Renewed every third of its TTL until released (`renew: true`).
    UntilReleased,
    /// Renewed, but for no longer than this after it was taken (`renew: true, max_hold:`).
    Capped(Duration),
}

impl Renewal {
    pub fn is_on(self) -> bool {
        self != Renewal::Off
    }

    /// The instant past which renewal stops, for a lock taken at `taken`.
    pub fn hold_until(self, taken: Instant) -> Option<Instant> {
        match self {
            Renewal::Capped(cap) => Some(taken + cap),
            _ => None,
        }
    }
}

/// A lock call: how long the lock lives, how long to wait for it, how many may hold it, in what
/// order waiters take it, and how it is renewed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Request {
    pub ttl_ms: u64,
    /// `None`: one attempt (`nonblocking_lock`, `try_lock`).
    pub wait: Option<Duration>,
    /// How many holders at once (1: the plain lock; more: a semaphore).
    pub limit: u32,
    /// Waiters take the lock in arrival order.
    pub fair: bool,
    pub renewal: Renewal,
}

impl Request {
    pub fn ttl(&self) -> Duration {
        Duration::from_millis(self.ttl_ms)
    }

    /// A semaphore (`limit` > 1) rather than the plain lock.
    pub fn is_shared(&self) -> bool {
        self.limit > 1
    }

    /// When a wait that starts now gives up: `None` for a single attempt.
    pub fn deadline(&self, started: Instant) -> Option<Instant> {
        self.wait.map(|wait| started + wait)
    }
}

/// `seconds` as a wait, from Ruby's Float: NaN, negative or out of range waits not at all.
pub fn wait_from_seconds(seconds: f64) -> Duration {
    Duration::try_from_secs_f64(seconds).unwrap_or(Duration::ZERO)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(limit: u32, wait: Option<f64>, renewal: Renewal) -> Request {
        Request {
            ttl_ms: 1_500,
            wait: wait.map(wait_from_seconds),
            limit,
            fair: false,
            renewal,
        }
    }

    #[test]
    fn a_capped_renewal_stops_at_the_cap_after_the_lock_was_taken() {
        let taken = Instant::now();
        let cap = Renewal::Capped(Duration::from_secs(3));
        assert_eq!(cap.hold_until(taken), Some(taken + Duration::from_secs(3)));
        assert_eq!(Renewal::UntilReleased.hold_until(taken), None);
        assert!(cap.is_on() && Renewal::UntilReleased.is_on() && !Renewal::Off.is_on());
    }

    #[test]
    fn a_single_attempt_has_no_deadline_and_a_wait_has_one() {
        let now = Instant::now();
        assert_eq!(request(1, None, Renewal::Off).deadline(now), None);
        let waiting = request(1, Some(0.25), Renewal::Off);
        assert_eq!(
            waiting.deadline(now),
            Some(now + Duration::from_millis(250))
        );
        assert_eq!(waiting.ttl(), Duration::from_millis(1_500));
    }

    #[test]
    fn only_a_limit_above_one_is_a_semaphore() {
        assert!(!request(1, None, Renewal::Off).is_shared());
        assert!(request(2, None, Renewal::Off).is_shared());
    }

    #[test]
    fn waits_ruby_cannot_mean_are_no_wait() {
        assert_eq!(wait_from_seconds(f64::NAN), Duration::ZERO);
        assert_eq!(wait_from_seconds(-1.0), Duration::ZERO);
        assert_eq!(wait_from_seconds(1e300), Duration::ZERO);
        assert_eq!(wait_from_seconds(0.5), Duration::from_millis(500));
    }
}
