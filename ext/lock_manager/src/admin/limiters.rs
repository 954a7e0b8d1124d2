//! The limiters `LockManager::Admin` lists: found by SCAN as locks are, then each read by its
//! kind's own script in its "peek" mode (`limits.rs`), with the rule its count was kept by: one
//! round trip per limiter, nothing changed.

use crate::error::LockError;
use crate::gvl::Interrupt;
use crate::limits::{LimitKind, Peek};
use crate::lock_core::LockCore;

use super::Scan;

/// One limiter as Redis has it now.
#[derive(Debug, PartialEq)]
pub struct LimiterView {
    /// Without the key prefix.
    pub name: Vec<u8>,
    pub kind: LimitKind,
    pub state: Peek,
}

impl LockCore {
    /// The limiters (not idle) whose names match `pattern`, a Redis glob, sorted by name then
    /// kind; the first `limit` of them when given.
    pub fn limiter_views(
        &self,
        pattern: &[u8],
        limit: Option<usize>,
        interrupt: &Interrupt,
    ) -> Result<Vec<LimiterView>, LockError> {
        let mut scan = Scan::limiters(self, pattern);
        let mut found = Vec::new();
        while let Some((_, keys)) = scan.next_keys(self, interrupt)? {
            for key in &keys {
                let Some((kind, name)) = self.keys().limiter_of(key) else {
                    continue;
                };
                let kind = std::str::from_utf8(kind).ok().and_then(LimitKind::parse);
                if let Some(kind) = kind {
                    found.push((name.to_vec(), kind));
                }
            }
        }
        found.sort_by(|a, b| (&a.0, a.1.name()).cmp(&(&b.0, b.1.name())));
        let limit = limit.unwrap_or(usize::MAX);
        let mut views = Vec::new();
        for (name, kind) in found {
            if views.len() == limit {
                break;
            }
            // Gone idle since SCAN saw it: not listed, and the next one read in its place.
            if let Some(state) = self.peek(kind, &name, interrupt)? {
                views.push(LimiterView { name, kind, state });
            }
        }
        Ok(views)
    }
}
