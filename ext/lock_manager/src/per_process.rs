//! One value per process, for what must not cross a fork: connections, threads, mutexes.
//!
//! A forked child builds its own value on first use. It never drops its parent's: that value's
//! threads do not exist in the child, its mutexes may be held forever, its sockets are the
//! parent's. It forgets it instead (a small, one-off leak per fork).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Once};

use arc_swap::ArcSwapOption;

/// This process's id, read once and again in every forked child (a `pthread_atfork` handler):
/// asking the kernel on every lock cycle cost a system call each time.
static PID: AtomicU32 = AtomicU32::new(0);
static WATCH_FORKS: Once = Once::new();

extern "C" fn forked_child() {
    PID.store(std::process::id(), Ordering::Release);
}

/// The id of the calling process.
pub fn current_pid() -> u32 {
    WATCH_FORKS.call_once(|| {
        PID.store(std::process::id(), Ordering::Release);
        // SAFETY: registers a handler that only stores an integer (async-signal-safe).
        unsafe { libc::pthread_atfork(None, None, Some(forked_child)) };
    });
    PID.load(Ordering::Acquire)
}

struct Owned<T> {
    pid: u32,
    value: Arc<T>,
}

pub struct PerProcess<T> {
    current: ArcSwapOption<Owned<T>>,
}

impl<T> PerProcess<T> {
    pub const fn new() -> Self {
        PerProcess {
            current: ArcSwapOption::const_empty(),
        }
    }

    /// This process's value, built by `create` on first use here; `true` when this call built
    /// it (two threads racing to build it: one wins, both get the winner's value).
    pub fn get_or_create(&self, create: impl Fn() -> T) -> (Arc<T>, bool) {
        let pid = current_pid();
        loop {
            let current = self.current.load_full();
            if let Some(owned) = current.as_ref().filter(|owned| owned.pid == pid) {
                return (Arc::clone(&owned.value), false);
            }
            let value = Arc::new(create());
            let fresh = Arc::new(Owned {
                pid,
                value: Arc::clone(&value),
            });
            let previous = self.current.compare_and_swap(&current, Some(fresh));
            let won = match (previous.as_ref(), current.as_ref()) {
                (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                (None, None) => true,
                _ => false,
            };
            if won {
                forget_if_inherited(current);
                return (value, true);
            }
        }
    }

    /// This process's value, if it was built here.
    pub fn get(&self) -> Option<Arc<T>> {
        let pid = current_pid();
        self.current
            .load_full()
            .filter(|owned| owned.pid == pid)
            .map(|owned| Arc::clone(&owned.value))
    }
}

impl<T> Drop for PerProcess<T> {
    fn drop(&mut self) {
        forget_if_inherited(self.current.swap(None));
    }
}

fn forget_if_inherited<T>(owned: Option<Arc<Owned<T>>>) {
    if let Some(owned) = owned.filter(|owned| owned.pid != current_pid()) {
        std::mem::forget(owned);
    }
}
