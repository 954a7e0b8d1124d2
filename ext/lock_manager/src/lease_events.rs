//! What the renewal thread did to each renewed lock, for Ruby's `renew.lock_manager` and
//! `lost.lock_manager` events as they happen. Kept only once Ruby listens (`listen`): until then
//! a renewal pays one atomic load. A Ruby thread takes them (`take`) without the GVL.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::error::LockError;
use crate::gvl::Interrupt;
use crate::per_process::PerProcess;
use crate::waker::Waker;

/// Events kept while nobody takes them; older ones are dropped first.
const MAX_PENDING: usize = 10_000;

/// One renewal, or the loss the renewal found.
#[derive(Debug, PartialEq)]
pub enum LeaseEvent {
    Renewed {
        key: Vec<u8>,
        ttl: Duration,
    },
    Lost {
        key: Vec<u8>,
        held: Duration,
        cause: &'static str,
    },
}

#[derive(Default)]
struct Pending {
    events: VecDeque<LeaseEvent>,
    /// The taker's, while it waits.
    taker: Option<Arc<Waker>>,
}

static LISTENING: AtomicBool = AtomicBool::new(false);
/// Per process: a child must not wait on a mutex its parent's renewal thread held at the fork.
static PENDING: PerProcess<Mutex<Pending>> = PerProcess::new();

/// From now on, renewals are recorded for `take`.
pub fn listen() {
    LISTENING.store(true, Ordering::Release);
}

/// Records what `event` makes, if Ruby listens.
pub fn record(event: impl FnOnce() -> LeaseEvent) {
    if !LISTENING.load(Ordering::Acquire) {
        return;
    }
    let (pending, _) = PENDING.get_or_create(Mutex::default);
    let mut pending = pending.lock().unwrap_or_else(|e| e.into_inner());
    if pending.events.len() >= MAX_PENDING {
        pending.events.pop_front();
    }
    pending.events.push_back(event());
    if let Some(taker) = &pending.taker {
        taker.wake();
    }
}

/// The events recorded since the last call, waiting up to `timeout` for one (fewer than none is
/// an empty list). `Err(Interrupted)` when Ruby interrupts the wait.
pub fn take(interrupt: &Interrupt, timeout: Duration) -> Result<Vec<LeaseEvent>, LockError> {
    let (pending, _) = PENDING.get_or_create(Mutex::default);
    {
        let mut pending = pending.lock().unwrap_or_else(|e| e.into_inner());
        if !pending.events.is_empty() {
            return Ok(pending.events.drain(..).collect());
        }
        pending.taker = Some(Arc::clone(interrupt.waker()));
    }
    let slept = interrupt.sleep_until(Instant::now() + timeout);
    let mut pending = pending.lock().unwrap_or_else(|e| e.into_inner());
    pending.taker = None;
    slept?;
    Ok(pending.events.drain(..).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_nothing_until_listened_to_then_hands_over_in_order() {
        record(|| unreachable!("not built while nobody listens"));
        listen();
        let renewed = |n: u64| LeaseEvent::Renewed {
            key: b"k".to_vec(),
            ttl: Duration::from_millis(n),
        };
        record(|| renewed(1));
        record(|| renewed(2));
        let interrupt = Interrupt::for_current_thread();
        let taken = take(&interrupt, Duration::from_millis(10)).unwrap();
        assert_eq!(taken, vec![renewed(1), renewed(2)]);
        let started = Instant::now();
        assert!(take(&interrupt, Duration::from_millis(30))
            .unwrap()
            .is_empty());
        assert!(started.elapsed() >= Duration::from_millis(30));
    }
}
