//! A held lock: the core it came from, its key and token, its fencing token, and the lease that
//! keeps it (renewal, or the one extension of a lock handed over). Every call acts only while its
//! token still holds the key.

use std::sync::Arc;
use std::time::Instant;

use crate::error::LockError;
use crate::gvl::Interrupt;
use crate::lock_core::{Acquisition, LockCore};
use crate::renewal::{Lease, LeaseTerms};
use crate::replies::FencingToken;
use crate::request::Request;

pub struct Lock {
    core: Arc<LockCore>,
    key: Vec<u8>,
    token: String,
    fencing_token: FencingToken,
    request: Request,
    lease: Option<Lease>,
}

impl Lock {
    /// A lock just acquired for `request`, its lease started when it needs one: renewal, or the
    /// extension of a lock a release handed over with a TTL shorter than the request's.
    pub fn new(
        core: &Arc<LockCore>,
        key: Vec<u8>,
        token: String,
        acquired: Acquisition,
        request: Request,
    ) -> Lock {
        let lease = (request.renewal.is_on() || acquired.expires_early.is_some()).then(|| {
            Lease::start(LeaseTerms {
                core: Arc::clone(core),
                key: key.clone(),
                token: token.clone(),
                request,
                taken: Instant::now(),
                expires_early: acquired.expires_early,
            })
        });
        Lock {
            core: Arc::clone(core),
            key,
            token,
            fencing_token: acquired.fencing_token,
            request,
            lease,
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

    /// Whether this token holds the key right now.
    pub fn is_owned(&self, interrupt: &Interrupt) -> Result<bool, LockError> {
        self.core.owned(&self.key, &self.token, interrupt)
    }

    /// Resets the TTL to `ttl_ms`; a pending extension of a lock handed over is dropped (it would
    /// overwrite this), a renewal goes on. False when the lock expired or changed hands.
    pub fn refresh(&self, ttl_ms: u64, interrupt: &Interrupt) -> Result<bool, LockError> {
        if !self.request.renewal.is_on() {
            self.stop_renewal();
        }
        let limit = self.request.limit;
        self.core
            .refresh(&self.key, &self.token, ttl_ms, limit, interrupt)
    }

    /// Stops the lease and deletes the lock (handing it to the next waiter). False when this
    /// token no longer held it.
    pub fn release(&self, interrupt: &Interrupt) -> Result<bool, LockError> {
        self.stop_renewal();
        self.core
            .release(&self.key, &self.token, self.request.limit, interrupt)
    }
}
