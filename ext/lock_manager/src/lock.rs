//! A held lock: the core it came from, its key and token, its fencing token, and the lease that
//! renews it (`renew: true`). Every call acts only while its token still holds the key, and only
//! in the process that took it: a child forked while it was held never releases, refreshes or
//! renews its parent's lock.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crate::error::LockError;
use crate::gvl::Interrupt;
use crate::held::{HoldId, Owner};
use crate::lock_core::{Acquisition, LockCore};
use crate::per_process::current_pid;
use crate::renewal::{Lease, LeaseTerms};
use crate::replies::FencingToken;
use crate::request::{Renewal, Request};

pub struct Lock {
    core: Arc<LockCore>,
    key: Vec<u8>,
    token: String,
    fencing_token: FencingToken,
    request: Request,
    lease: Option<Lease>,
    /// The process that took it.
    pid: u32,
    /// This plain lock's entry in the registry of held locks, until it is released (see
    /// `LockCore::hold`).
    holder: Option<HoldId>,
    released: AtomicBool,
}

impl Lock {
    /// A lock just acquired for `request` by `thread`, with the request's TTL; its lease started
    /// when it is renewed.
    pub fn new(
        core: &Arc<LockCore>,
        key: Vec<u8>,
        token: String,
        acquired: Acquisition,
        request: Request,
        thread: Owner,
    ) -> Lock {
        let taken = Instant::now();
        let lease = request.renewal.is_on().then(|| {
            Lease::start(LeaseTerms {
                core: Arc::clone(core),
                key: key.clone(),
                token: token.clone(),
                request,
                taken,
            })
        });
        // Valid for its TTL, or renewed up to its cap (never past it); uncapped: until released.
        let until = match request.renewal {
            Renewal::Off => Some(taken + request.ttl()),
            renewed => renewed.hold_until(taken),
        };
        let holder = (!request.is_shared()).then(|| core.held().hold(&key, until, thread));
        Lock {
            core: Arc::clone(core),
            key,
            token,
            fencing_token: acquired.fencing_token,
            request,
            lease,
            pid: current_pid(),
            holder,
            released: AtomicBool::new(false),
        }
    }

    pub fn key(&self) -> &[u8] {
        &self.key
    }

    pub fn token(&self) -> &str {
        &self.token
    }

    pub fn fencing_token(&self) -> FencingToken {
        self.fencing_token
    }

    /// Whether this process took it (false in a child forked while it was held).
    pub fn is_here(&self) -> bool {
        self.pid == current_pid()
    }

    /// True once its lease found the lock lost (expired, taken by another, `max_hold` reached);
    /// a lock without a lease is not watched.
    pub fn is_lost(&self) -> bool {
        self.lease.as_ref().is_some_and(Lease::is_lost)
    }

    /// Stops renewing: the lock keeps its current TTL.
    pub fn stop_renewal(&self) {
        if let Some(lease) = &self.lease {
            lease.stop();
        }
    }

    /// Whether this token holds the key right now; never, in a child process.
    pub fn is_owned(&self, interrupt: &Interrupt) -> Result<bool, LockError> {
        if !self.is_here() {
            return Ok(false);
        }
        self.core.owned(&self.key, &self.token, interrupt)
    }

    /// Resets the TTL to `ttl_ms`; a renewal goes on. False when the lock expired or changed
    /// hands, and in a child process.
    pub fn refresh(&self, ttl_ms: u64, interrupt: &Interrupt) -> Result<bool, LockError> {
        if !self.is_here() {
            return Ok(false);
        }
        let limit = self.request.limit;
        let sent = Instant::now();
        let refreshed = self
            .core
            .refresh(&self.key, &self.token, ttl_ms, limit, interrupt)?;
        if let (true, Some(id), false) = (refreshed, self.holder, self.request.renewal.is_on()) {
            let until = sent + std::time::Duration::from_millis(ttl_ms);
            self.core.held().held_until(id, Some(until));
        }
        Ok(refreshed)
    }

    /// Stops the lease and deletes the lock (handing it to the next waiter). False when this
    /// token no longer held it, and in a child process (which leaves its parent's lock alone).
    pub fn release(&self, interrupt: &Interrupt) -> Result<bool, LockError> {
        if !self.is_here() {
            return Ok(false);
        }
        self.stop_renewal();
        self.forget_holder();
        self.core
            .release(&self.key, &self.token, self.request.limit, interrupt)
    }

    /// `release`, handing a lock (a permit) no waiter is queued for to the first job parked on it
    /// (`parking.rs`): a parked job's own lock.
    pub fn release_parked(&self, interrupt: &Interrupt) -> Result<bool, LockError> {
        if !self.is_here() {
            return Ok(false);
        }
        self.stop_renewal();
        self.forget_holder();
        self.core
            .release_parked(&self.key, &self.token, self.request.limit, interrupt)
    }

    /// Stops the lease and leaves the lock in Redis for `ttl_ms` more, for another process to
    /// take over (a unique job's lock while the job waits for its retry). This process no longer
    /// counts it as held. False when the token no longer held it, and in a child process.
    pub fn keep(&self, ttl_ms: u64, interrupt: &Interrupt) -> Result<bool, LockError> {
        if !self.is_here() {
            return Ok(false);
        }
        self.stop_renewal();
        self.forget_holder();
        self.core.refresh(
            &self.key,
            &self.token,
            ttl_ms,
            self.request.limit,
            interrupt,
        )
    }

    fn forget_holder(&self) {
        if let Some(id) = self.holder {
            if !self.released.swap(true, Ordering::AcqRel) {
                self.core.held().unhold(id);
            }
        }
    }
}

impl Drop for Lock {
    fn drop(&mut self) {
        if self.is_here() {
            self.forget_holder();
        }
    }
}
