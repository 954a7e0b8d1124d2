//! What the Ruby-facing calls share: the request of a lock call from Ruby's arguments, Ruby
//! Strings copied out before the GVL is released, and a Rust call run without the GVL.

use std::time::Duration;

use magnus::{prelude::*, Error, Integer, RArray, RString, Ruby, TryConvert, Value};

use crate::error::LockError;
use crate::gvl::{self, Interrupt};
use crate::held::Owner;
use crate::request::{wait_from_seconds, Renewal, Request};

/// The request of one lock call, from what Ruby passes.
pub fn request(
    ttl_ms: u64,
    wait: Option<f64>,
    limit: u32,
    fair: bool,
    renewal: Value,
) -> Result<Request, Error> {
    let renewal = match Integer::from_value(renewal) {
        Some(cap_ms) => Renewal::Capped(Duration::from_millis(cap_ms.to_u64()?)),
        None if renewal.to_bool() => Renewal::UntilReleased,
        None => Renewal::Off,
    };
    Ok(Request {
        ttl_ms,
        wait: wait.map(wait_from_seconds),
        limit,
        fair,
        renewal,
    })
}

/// Runs `work` without the GVL until it finishes. When Ruby interrupts it, Ruby's own exception
/// (Timeout::Error, Interrupt, a kill) is raised here, after Rust cleaned up; an interrupt that
/// raises nothing (Thread#wakeup) lets the work resume. Other errors become `to_ruby`'s.
pub fn blocking<R>(
    ruby: &Ruby,
    to_ruby: impl FnOnce(LockError) -> Error,
    mut work: impl FnMut(&Interrupt) -> Result<R, LockError>,
) -> Result<R, Error> {
    loop {
        match gvl::without_gvl(|interrupt| work(interrupt)) {
            Err(LockError::Interrupted) => ruby.thread_check_ints()?,
            outcome => return outcome.map_err(to_ruby),
        }
    }
}

pub fn copy_bytes(key: RString) -> Vec<u8> {
    unsafe { key.as_slice() }.to_vec()
}

/// Each String of `keys`, copied (a TypeError for anything else).
pub fn copy_keys(keys: RArray) -> Result<Vec<Vec<u8>>, Error> {
    keys.into_iter()
        .map(|key| RString::try_convert(key).map(copy_bytes))
        .collect()
}

/// The calling Ruby Thread, as the held-locks registry names it (its object: alive as long as the
/// thread is, and the locks it holds name it).
pub fn current_thread(_ruby: &Ruby) -> Owner {
    // SAFETY: a `&Ruby` means this thread holds the GVL; the call only reads the current Thread.
    unsafe { rb_sys::rb_thread_current() as Owner }
}
