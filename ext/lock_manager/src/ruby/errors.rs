//! The one place where Rust errors become Ruby exceptions.
//!
//! The exception classes are defined in Ruby (`lib/lock_manager/errors.rb`), which is loaded
//! before this library; they are looked up once, when it loads.

use std::sync::OnceLock;

use magnus::{exception::ExceptionClass, prelude::*, value::Opaque, Error, RModule, RString, Ruby};

use crate::error::{LockError, Unavailable};

/// Longest part of a key quoted in a message: keys may be megabytes of binary.
const KEY_PREVIEW_CHARS: usize = 120;

struct Classes {
    error: Opaque<ExceptionClass>,
    not_acquired: Opaque<ExceptionClass>,
    connection: Opaque<ExceptionClass>,
    timeout: Opaque<ExceptionClass>,
    authentication: Opaque<ExceptionClass>,
    permission: Opaque<ExceptionClass>,
    out_of_memory: Opaque<ExceptionClass>,
    pool_timeout: Opaque<ExceptionClass>,
    read_only: Opaque<ExceptionClass>,
    loading: Opaque<ExceptionClass>,
    cluster_down: Opaque<ExceptionClass>,
    too_many_clients: Opaque<ExceptionClass>,
    cluster: Opaque<ExceptionClass>,
    already_held: Opaque<ExceptionClass>,
    not_replicated: Opaque<ExceptionClass>,
    tls: Opaque<ExceptionClass>,
}

static CLASSES: OnceLock<Classes> = OnceLock::new();

/// Looks the gem's exception classes up: a missing one fails loading the library.
pub fn init(lock_manager: RModule) -> Result<(), Error> {
    let class = |name: &str| -> Result<Opaque<ExceptionClass>, Error> {
        Ok(lock_manager.const_get::<_, ExceptionClass>(name)?.into())
    };
    let classes = Classes {
        error: class("Error")?,
        not_acquired: class("LockNotAcquired")?,
        connection: class("ConnectionError")?,
        timeout: class("TimeoutError")?,
        authentication: class("AuthenticationError")?,
        tls: class("TLSError")?,
        permission: class("PermissionError")?,
        out_of_memory: class("OutOfMemoryError")?,
        pool_timeout: class("PoolTimeout")?,
        read_only: class("ReadOnlyError")?,
        loading: class("LoadingError")?,
        cluster_down: class("ClusterDownError")?,
        too_many_clients: class("TooManyClientsError")?,
        cluster: class("ClusterError")?,
        already_held: class("AlreadyHeld")?,
        not_replicated: class("NotReplicated")?,
    };
    let _ = CLASSES.set(classes);
    Ok(())
}

/// The error about the lock `key` (as the caller gave it: LockNotAcquired carries it).
pub fn for_key(ruby: &Ruby, error: LockError, key: RString) -> Error {
    if let LockError::NotAcquired { waited } = error {
        let class = class(ruby, |c| c.not_acquired);
        let built = class.new_instance((key, waited.as_secs_f64()));
        return built.map_or_else(|e| e, |exception: magnus::Exception| exception.into());
    }
    for_key_bytes(ruby, error, unsafe { key.as_slice() })
}

/// The same, for a key known by its bytes (a held lock's).
pub fn for_key_bytes(ruby: &Ruby, error: LockError, key: &[u8]) -> Error {
    for_subject(ruby, error, &format_args!("lock {}", quote_key(key)))
}

/// The gem's exception for `error`, its message about `subject` ("lock \"report\"", say).
pub fn for_subject(ruby: &Ruby, error: LockError, subject: &dyn std::fmt::Display) -> Error {
    if let LockError::Argument(message) = error {
        return instantiate(ruby.exception_arg_error(), message);
    }
    let class = class(ruby, |c| match &error {
        LockError::Connection {
            timed_out: true, ..
        } => c.timeout,
        LockError::Connection { .. } => c.connection,
        LockError::Authentication { .. } => c.authentication,
        LockError::Tls { .. } => c.tls,
        LockError::Permission { .. } => c.permission,
        LockError::OutOfMemory { .. } => c.out_of_memory,
        LockError::PoolTimeout { .. } => c.pool_timeout,
        LockError::Unavailable { reason, .. } => match reason {
            Unavailable::ReadOnly => c.read_only,
            Unavailable::Loading => c.loading,
            Unavailable::ClusterDown => c.cluster_down,
            Unavailable::TooManyClients => c.too_many_clients,
        },
        LockError::Cluster { .. } => c.cluster,
        LockError::AlreadyHeld => c.already_held,
        LockError::NotReplicated { .. } => c.not_replicated,
        LockError::NotAcquired { .. } => c.not_acquired,
        LockError::Server { .. }
        | LockError::Interrupted
        | LockError::Internal(_)
        | LockError::Argument(_) => c.error,
    });
    instantiate(class, format!("{subject}: {error}"))
}

/// For errors that are not about one key (building a Locker).
pub fn unkeyed(ruby: &Ruby, error: LockError) -> Error {
    match error {
        LockError::Argument(message) => instantiate(ruby.exception_arg_error(), message),
        other => instantiate(class(ruby, |c| c.error), other.to_string()),
    }
}

fn class(ruby: &Ruby, pick: impl Fn(&Classes) -> Opaque<ExceptionClass>) -> ExceptionClass {
    CLASSES.get().map_or_else(
        || ruby.exception_runtime_error(),
        |c| ruby.get_inner(pick(c)),
    )
}

/// Builds the exception now rather than leaving it to magnus (`Error::new`): magnus builds lazy
/// errors while raising and panics if that is interrupted, which a pending Thread#kill or
/// process exit does. Built here, such an interrupt is returned instead, and wins.
fn instantiate(class: ExceptionClass, message: String) -> Error {
    class
        .new_instance((message,))
        .map_or_else(|e| e, |exception: magnus::Exception| exception.into())
}

/// `"MyWorker"`, escaped and shortened; binary keys show their bytes, never raw control codes.
pub fn quote_key(key: &[u8]) -> String {
    let text = String::from_utf8_lossy(key);
    let preview: String = text.chars().take(KEY_PREVIEW_CHARS).collect();
    let more = text.chars().count() > KEY_PREVIEW_CHARS;
    format!("{preview:?}{}", if more { " (truncated)" } else { "" })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_quoted_escaped_and_shortened() {
        assert_eq!(quote_key(b"MyWorker"), "\"MyWorker\"");
        assert_eq!(quote_key(b"a\nb\0"), "\"a\\nb\\0\"");
        let long = quote_key(&[b'x'; 1_000]);
        assert!(
            long.ends_with("\" (truncated)") && long.len() < 200,
            "{long}"
        );
        assert_eq!(quote_key(&[0xff]), "\"\u{fffd}\"");
    }
}
