//! Waking a sleeping waiter from another thread: a released lock, a hand-off, Ruby's interrupt.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
#[cfg(not(target_os = "linux"))]
use std::sync::{Condvar, Mutex};
use std::time::Duration;

/// Wakes a thread sleeping in `Interrupt::sleep_until`, from another thread. On Linux it is a
/// futex word, so waking is async-signal-safe: Ruby may then call our unblocking function
/// straight from its signal handler (see `gvl::NOGVL_FLAGS`).
#[derive(Default)]
pub struct Waker {
    /// 1 once woken, until the sleeper consumes it.
    woken: AtomicU32,
    /// The fencing token of a lock a release handed to the sleeper (0: none), until it takes it.
    handed: AtomicU64,
    #[cfg(not(target_os = "linux"))]
    parked: Mutex<()>,
    #[cfg(not(target_os = "linux"))]
    wake: Condvar,
}

impl Waker {
    /// Ends the current (or next) sleep of the thread early; it then re-checks what it waits for.
    pub fn wake(&self) {
        self.woken.store(1, Ordering::Release);
        self.notify();
    }

    /// Wakes the thread with the news that a release handed it the lock, with this fencing token.
    pub fn hand_over(&self, fencing_token: u64) {
        self.handed.store(fencing_token, Ordering::Release);
        self.wake();
    }

    /// Consumes a wake-up: true when one came since the last call.
    pub fn take_woken(&self) -> bool {
        self.woken.swap(0, Ordering::AcqRel) == 1
    }

    /// The fencing token of a lock handed over since the last call, if any.
    pub fn take_handed(&self) -> Option<u64> {
        Some(self.handed.swap(0, Ordering::AcqRel)).filter(|&token| token != 0)
    }

    #[cfg(target_os = "linux")]
    fn notify(&self) {
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                self.woken.as_ptr(),
                libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
                i32::MAX,
            );
        }
    }

    /// Blocks while nothing woke us, for `timeout` at most (or less: spurious returns are fine).
    /// True when a signal cut it short.
    #[cfg(target_os = "linux")]
    pub fn park(&self, timeout: Duration) -> bool {
        let timeout = libc::timespec {
            tv_sec: timeout.as_secs().min(i32::MAX as u64) as libc::time_t,
            tv_nsec: timeout.subsec_nanos() as libc::c_long,
        };
        let waited = unsafe {
            libc::syscall(
                libc::SYS_futex,
                self.woken.as_ptr(),
                libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
                0u32,
                &timeout as *const libc::timespec,
            )
        };
        waited == -1 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR)
    }

    #[cfg(not(target_os = "linux"))]
    fn notify(&self) {
        drop(self.parked.lock());
        self.wake.notify_all();
    }

    #[cfg(not(target_os = "linux"))]
    pub fn park(&self, timeout: Duration) -> bool {
        if let Ok(guard) = self.parked.lock() {
            if self.woken.load(Ordering::Acquire) == 0 {
                let _ = self.wake.wait_timeout(guard, timeout);
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Instant;

    #[test]
    fn a_wake_before_the_park_is_not_lost() {
        let waker = Waker::default();
        waker.wake();
        let started = Instant::now();
        waker.park(Duration::from_secs(5));
        assert!(started.elapsed() < Duration::from_secs(1));
        assert!(waker.take_woken());
        assert!(!waker.take_woken());
    }

    #[test]
    fn another_thread_ends_a_park_early() {
        let waker = Arc::new(Waker::default());
        let other = Arc::clone(&waker);
        let waking = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            other.wake();
        });
        let started = Instant::now();
        while !waker.take_woken() {
            waker.park(Duration::from_secs(5));
        }
        assert!(started.elapsed() < Duration::from_secs(2));
        waking.join().unwrap();
    }

    #[test]
    fn a_hand_over_is_taken_once() {
        let waker = Waker::default();
        assert_eq!(waker.take_handed(), None);
        waker.hand_over(7);
        assert_eq!(waker.take_handed(), Some(7));
        assert_eq!(waker.take_handed(), None);
        assert!(waker.take_woken());
    }
}
