//! How long a blocking acquire waits between two attempts.

use std::time::Duration;

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
    fn a_cap_below_the_first_step_wins() {
        let mut backoff = Backoff::new(Duration::from_micros(500));
        assert!((0..10).all(|_| backoff.next_pause() <= Duration::from_micros(500)));
    }
}
