//! The plain locks each thread of this process holds through one core, so that a thread asking
//! again for a lock it holds is refused at once (`AlreadyHeld`), without a round trip: re-entry
//! would otherwise wait on itself until its own lock expired.
//!
//! A thread is the caller's (`Owner`): Ruby's Thread, not the OS thread under it, which Ruby hands
//! to a new Thread once the old one has finished (a lock handle the old one left held would then
//! refuse the new one).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use crate::error::LockError;
use crate::per_process::PerProcess;

/// A plain lock some thread holds: which thread, which key, until when it is valid unless
/// renewed or refreshed (`None`: renewed until released), and which acquisition it is (a thread
/// may keep an expired handle of the key beside the lock it holds now).
type Held = (Owner, Vec<u8>, Option<Instant>, HoldId);

/// The thread a lock is held by, as the caller names it (the seam: Ruby's current Thread).
pub type Owner = u64;

/// One acquisition's entry in the registry of held locks.
pub type HoldId = u64;

static NEXT_HOLD: AtomicU64 = AtomicU64::new(0);

/// The registry of one core; a forked child starts with none (its locks are its parent's).
pub struct HeldLocks {
    by_thread: PerProcess<Mutex<Vec<Held>>>,
}

impl HeldLocks {
    pub const fn new() -> Self {
        HeldLocks {
            by_thread: PerProcess::new(),
        }
    }

    /// Fails with `AlreadyHeld` when `thread` holds the plain lock `key` through this
    /// core and it has not expired (see `hold`).
    pub fn check_not_held(&self, key: &[u8], thread: Owner) -> Result<(), LockError> {
        let now = Instant::now();
        let (held, _) = self.by_thread.get_or_create(Mutex::default);
        let held = held.lock().unwrap_or_else(|e| e.into_inner());
        let valid = |until: &Option<Instant>| until.is_none_or(|until| until > now);
        match held
            .iter()
            .any(|(by, k, until, _)| *by == thread && k == key && valid(until))
        {
            true => Err(LockError::AlreadyHeld),
            false => Ok(()),
        }
    }

    /// Records that `thread` holds the plain lock `key`, valid `until` (see `Held`),
    /// until `unhold`.
    pub fn hold(&self, key: &[u8], until: Option<Instant>, thread: Owner) -> HoldId {
        let id = NEXT_HOLD.fetch_add(1, Ordering::Relaxed);
        let (held, _) = self.by_thread.get_or_create(Mutex::default);
        let mut held = held.lock().unwrap_or_else(|e| e.into_inner());
        held.push((thread, key.to_vec(), until, id));
        id
    }

    /// A refresh of the held lock `id`: valid `until`.
    pub fn held_until(&self, id: HoldId, until: Option<Instant>) {
        if let Some(held) = self.by_thread.get() {
            let mut held = held.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(entry) = held.iter_mut().find(|entry| entry.3 == id) {
                entry.2 = until;
            }
        }
    }

    /// Forgets the `hold` `id` (in this process: a child's locks are its parent's).
    pub fn unhold(&self, id: HoldId) {
        if let Some(held) = self.by_thread.get() {
            let mut held = held.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(at) = held.iter().position(|entry| entry.3 == id) {
                held.swap_remove(at);
            }
        }
    }
}
