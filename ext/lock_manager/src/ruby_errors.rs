//! The one place where Rust errors become Ruby exceptions.
//!
//! The exception classes are defined in Ruby (`lib/lock_manager/errors.rb`), which is loaded
//! before this library; they are looked up when raised (a rare path) rather than cached.

use magnus::{exception::ExceptionClass, prelude::*, Error, RModule, RString, Ruby};

use crate::error::LockError;

/// Longest part of a key quoted in a message: keys may be megabytes of binary.
const KEY_PREVIEW_CHARS: usize = 120;

pub fn to_ruby(ruby: &Ruby, error: LockError, key: RString) -> Error {
    let quoted = quote_key(unsafe { key.as_slice() });
    let class = match &error {
        LockError::NotAcquired { waited } => {
            return not_acquired(ruby, key, waited.as_secs_f64()).unwrap_or_else(|e| e)
        }
        LockError::Argument(message) => {
            return instantiate(ruby.exception_arg_error(), message.clone()).unwrap_or_else(|e| e)
        }
        LockError::Connection {
            timed_out: true, ..
        } => "TimeoutError",
        LockError::Connection { .. } => "ConnectionError",
        LockError::Authentication { .. } => "AuthenticationError",
        LockError::Permission { .. } => "PermissionError",
        LockError::OutOfMemory { .. } => "OutOfMemoryError",
        LockError::PoolTimeout { .. } => "PoolTimeout",
        LockError::Server { .. } | LockError::Interrupted | LockError::Internal(_) => "Error",
    };
    let built = new_error(ruby, class, format!("lock {quoted}: {error}"));
    built.unwrap_or_else(|lookup_failure| lookup_failure)
}

/// For errors that are not about one key (building a Locker).
pub fn to_ruby_unkeyed(ruby: &Ruby, error: LockError) -> Error {
    match error {
        LockError::Argument(message) => {
            instantiate(ruby.exception_arg_error(), message).unwrap_or_else(|e| e)
        }
        other => new_error(ruby, "Error", other.to_string()).unwrap_or_else(|e| e),
    }
}

fn lock_manager(ruby: &Ruby) -> Result<RModule, Error> {
    ruby.class_object().const_get("LockManager")
}

fn new_error(ruby: &Ruby, class_name: &str, message: String) -> Result<Error, Error> {
    instantiate(lock_manager(ruby)?.const_get(class_name)?, message)
}

/// Builds the exception now rather than leaving it to magnus (`Error::new`): magnus builds lazy
/// errors while raising and panics if that is interrupted, which a pending Thread#kill or
/// process exit does. Built here, such an interrupt is returned instead, and wins.
fn instantiate(class: ExceptionClass, message: String) -> Result<Error, Error> {
    let exception: magnus::Exception = class.new_instance((message,))?;
    Ok(exception.into())
}

fn not_acquired(ruby: &Ruby, key: RString, waited: f64) -> Result<Error, Error> {
    let class: ExceptionClass = lock_manager(ruby)?.const_get("LockNotAcquired")?;
    let exception: magnus::Exception = class.new_instance((key, waited))?;
    Ok(exception.into())
}

/// `"MyWorker"`, escaped and shortened; binary keys show their bytes, never raw control codes.
pub fn quote_key(key: &[u8]) -> String {
    let text = String::from_utf8_lossy(key);
    let preview: String = text.chars().take(KEY_PREVIEW_CHARS).collect();
    let more = text.chars().count() > KEY_PREVIEW_CHARS;
    format!("{preview:?}{}", if more { " (truncated)" } else { "" })
}
