//! What Redis's replies and I/O errors mean for the lock core: which errors a fresh connection
//! may cure, which are Ruby's interrupts, which refusals the user must act on. Pure functions of
//! the error or reply, so that each rule is tested without a Redis.

use std::time::Duration;

use redis::RedisError;

use crate::error::{LockError, Unavailable};
use crate::scripts;

/// A fencing token: a number, issued with each acquisition, that only grows for a key.
pub type FencingToken = u64;

/// Why a round trip failed, as far as the connection is concerned.
#[derive(Debug)]
pub enum Failure {
    /// The connection died (reset, EOF, broken pipe): a fresh one may well work.
    Dropped(RedisError),
    /// A signal that was not for us (SIGCHLD from any child process, say: Ruby's handlers do
    /// not restart system calls) cut a command that is safe to repeat short: worth retrying on a
    /// fresh connection.
    Signalled(RedisError),
    /// Ruby interrupted the thread mid-command.
    Interrupted,
    /// No usable answer: timeout, garbled reply. Whether the command ran is unknown.
    Unusable(RedisError),
    /// Redis answered with an error reply; the connection itself is fine.
    Refused(RedisError),
}

impl Failure {
    /// Whether the connection can serve the next caller: not after an I/O failure, nor once
    /// Redis said it is the wrong server to ask (a replica, loading, full).
    pub fn keeps_connection(&self) -> bool {
        match self {
            Failure::Refused(error) => !matches!(
                unavailable(error),
                Some(Unavailable::ReadOnly | Unavailable::Loading | Unavailable::TooManyClients)
            ),
            _ => false,
        }
    }
}

/// Why Redis cannot serve us now, when its reply says so.
pub fn unavailable(error: &RedisError) -> Option<Unavailable> {
    match error.code() {
        Some("READONLY" | "MASTERDOWN") => Some(Unavailable::ReadOnly),
        Some("LOADING") => Some(Unavailable::Loading),
        Some("CLUSTERDOWN" | "TRYAGAIN") => Some(Unavailable::ClusterDown),
        _ if error.to_string().contains("max number of clients reached") => {
            Some(Unavailable::TooManyClients)
        }
        _ => None,
    }
}

/// What a Cluster node's refusal asks of us.
#[derive(Debug, PartialEq)]
pub enum Redirect<'a> {
    /// MOVED: the slot is served by this node ("host:port") now.
    Moved(&'a str),
    /// ASK or TRYAGAIN: the slot is migrating; ask again shortly.
    Migrating,
    /// CLUSTERDOWN: the Cluster cannot serve the slot now (a failover).
    Down,
}

/// How a Cluster's refusal is answered, or `None` when it is no redirection.
pub fn cluster_redirect(error: &RedisError) -> Option<Redirect<'_>> {
    match error.code() {
        Some("MOVED") => error.redirect_node().map(|(node, _)| Redirect::Moved(node)),
        Some("ASK" | "TRYAGAIN") => Some(Redirect::Migrating),
        Some("CLUSTERDOWN") => Some(Redirect::Down),
        // A script that found one of its keys gone mid-run in a migrating slot (the scripts
        // never delete a key they touch again, so what it wrote is safe to write again).
        _ if error.to_string().contains("non local key") => Some(Redirect::Migrating),
        _ => None,
    }
}

/// MOVED, ASK or CROSSSLOT: a Cluster node answered.
fn is_cluster_redirect(error: &RedisError) -> bool {
    matches!(error.code(), Some("MOVED" | "ASK" | "CROSSSLOT"))
}

/// `undoable`: the command has an undo (an acquire). Cut short by any signal, it is undone and
/// handed back to Ruby, which resumes it with a new token: retried with the same token on another
/// connection, it could be overtaken by its own late undo. `to_ruby`: the thread takes signals to
/// Ruby (see `Interrupt::takes_signals_to_ruby`).
pub fn classify(error: RedisError, undoable: bool, to_ruby: bool) -> Failure {
    let signalled = is_signalled(&error);
    if signalled && (undoable || to_ruby) {
        Failure::Interrupted
    } else if signalled {
        Failure::Signalled(error)
    } else if error.is_timeout() {
        Failure::Unusable(error)
    } else if error.is_connection_dropped() {
        Failure::Dropped(error)
    } else if error.is_io_error() || error.kind() == redis::ErrorKind::Parse {
        Failure::Unusable(error)
    } else {
        Failure::Refused(error)
    }
}

/// True when a system call returned EINTR: a signal arrived while we waited for Redis.
/// redis-rs keeps the `io::Error` behind an `Arc<dyn Error>` that cannot be downcast, so this
/// reads std's stable rendering of OS errors, "... (os error N)".
pub fn is_signalled(error: &RedisError) -> bool {
    error.is_io_error()
        && error
            .to_string()
            .ends_with(&format!("(os error {})", libc::EINTR))
}

/// What failed in a TLS handshake, for a user to act on, or `None` when `error` is no TLS
/// failure. rustls's errors reach us only as text (see `is_signalled`): "invalid peer
/// certificate: ..." is about the server's certificate, "received fatal alert: ..." is the
/// server refusing ours.
pub fn tls_failure(error: &RedisError) -> Option<String> {
    let text = error.to_string();
    if let Some((_, what)) = text.split_once("invalid peer certificate: ") {
        return Some(server_certificate_refused(what.trim()));
    }
    let (_, alert) = text.split_once("received fatal alert: ")?;
    Some(client_certificate_refused(alert.trim()))
}

fn server_certificate_refused(what: &str) -> String {
    let why = if what == "UnknownIssuer" {
        "is not signed by a CA this client trusts (set tls_ca_file to the CA that signed it)"
    } else if what.contains("not valid for name") {
        "is for another name (hostname mismatch: connect by a name it was issued for)"
    } else if what.contains("expired") || what == "Expired" {
        "has expired"
    } else if what.contains("not valid yet") || what == "NotValidYet" {
        "is not valid yet"
    } else {
        "is not accepted"
    };
    format!("the server's certificate {why} ({what})")
}

fn client_certificate_refused(alert: &str) -> String {
    let why = match alert {
        "CertificateRequired" => {
            "the server requires a client certificate (set tls_cert_file and tls_key_file)"
        }
        "UnknownCA" | "BadCertificate" | "CertificateUnknown" => {
            "the server does not trust this client's certificate \
             (not signed by a CA of its tls-ca-cert-file)"
        }
        "CertificateExpired" => "the server says this client's certificate has expired",
        _ => "the server ended the handshake (a client certificate missing or refused?)",
    };
    format!("{why} (alert {alert})")
}

/// What a connection that failed under a command comes to: a TLS failure, a timeout (the
/// reply did not come within `read_timeout`), or Redis unreachable. `undone`: an undo was sent.
pub fn broken(addr: &str, error: &RedisError, read_timeout: Duration, undone: bool) -> LockError {
    if let Some(cause) = tls_failure(error) {
        return LockError::Tls {
            addr: addr.to_owned(),
            cause,
        };
    }
    let cause = if error.is_timeout() {
        let timeout = read_timeout.as_secs_f64();
        format!("no reply within read_timeout ({timeout:.3}s)")
    } else {
        error.to_string()
    };
    LockError::Connection {
        addr: addr.to_owned(),
        cause,
        timed_out: error.is_timeout(),
        undone,
    }
}

/// Redis refused our credentials (at connect, or in a reply).
pub fn is_authentication(error: &RedisError) -> bool {
    error.kind() == redis::ErrorKind::AuthenticationFailed
        || matches!(error.code(), Some("WRONGPASS" | "NOAUTH"))
}

/// An ACL refusal: NOPERM, or the ERR a script gets for a command, key or channel its user may not
/// use: "The user executing the script can't ..." (Redis 7.0), "ACL failure in script: ..." (Redis
/// 7.2 and later, Valkey).
pub fn is_permission(error: &RedisError) -> bool {
    let text = error.to_string();
    error.code() == Some("NOPERM")
        // A refusal while connecting (SELECT), which the redis crate rewords around NOPERM's text.
        || text.contains("has no permissions to run")
        || text.contains("The user executing the script can't")
        || text.contains("ACL failure in script")
}

/// Redis refused the credentials, or what the user may touch (an ACL): asking again won't help.
pub fn is_refused_access(error: &RedisError) -> bool {
    is_authentication(error) || is_permission(error)
}

/// An error reply as Redis wrote it ("READONLY You can't write..."): redis-rs shows the codes it
/// knows by names of its own ("ReadOnly: ...").
fn reply_text(error: &RedisError) -> String {
    match (error.code(), error.detail()) {
        (Some(code), Some(detail)) => format!("{code} {detail}"),
        _ => error.to_string(),
    }
}

/// An error reply, by its code: each kind the caller can act on has its own error.
pub fn refusal(addr: &str, error: &RedisError) -> LockError {
    let (addr, reply) = (addr.to_owned(), reply_text(error));
    if is_authentication(error) {
        LockError::Authentication { addr, cause: reply }
    } else if is_permission(error) {
        let reply = match scripts::refused_line(&reply) {
            Some(line) => format!("{reply} Refused: {line}"),
            None => reply,
        };
        LockError::Permission { addr, reply }
    } else if error.code() == Some("OOM") {
        LockError::OutOfMemory { addr, reply }
    } else if let Some(reason) = unavailable(error) {
        LockError::Unavailable {
            addr,
            reply,
            reason,
        }
    } else if is_cluster_redirect(error) {
        LockError::Cluster { addr, reply }
    } else {
        LockError::Server { addr, reply }
    }
}

/// What one attempt found.
#[derive(Debug, PartialEq)]
pub enum Attempt {
    Acquired(FencingToken),
    /// Held by others; `retry_in` is when it expires on its own, when Redis said.
    Held {
        retry_in: Option<Duration>,
    },
    /// A waiter that was queued is not any more (its place lapsed): it must queue anew.
    NotQueued,
}

/// The reply of the queue and semaphore scripts: `{1, fencing token}` acquired; `{0, ms}` held,
/// expiring on its own in `ms` (negative: unknown); `{-1, 0}` no longer queued.
pub fn attempt_from(reply: &[i64]) -> Attempt {
    match reply {
        [1, fencing_token, ..] => Attempt::Acquired(*fencing_token as FencingToken),
        [-1, ..] => Attempt::NotQueued,
        [_, ms, ..] if *ms >= 0 => Attempt::Held {
            retry_in: Some(Duration::from_millis(*ms as u64 + 1)),
        },
        _ => Attempt::Held { retry_in: None },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::ErrorKind;

    #[test]
    fn cluster_refusals_are_followed_or_asked_again() {
        let moved = reply("MOVED 3999 127.0.0.1:6381");
        assert_eq!(
            cluster_redirect(&moved),
            Some(Redirect::Moved("127.0.0.1:6381"))
        );
        let ask = reply("ASK 3999 127.0.0.1:6381");
        assert_eq!(cluster_redirect(&ask), Some(Redirect::Migrating));
        let again = reply("TRYAGAIN Multiple keys request during rehashing of slot");
        assert_eq!(cluster_redirect(&again), Some(Redirect::Migrating));
        let down = reply("CLUSTERDOWN The cluster is down");
        assert_eq!(cluster_redirect(&down), Some(Redirect::Down));
        assert_eq!(cluster_redirect(&reply("ERR unknown")), None);
        let moved_away = reply(
            "ERR Script attempted to access a non local key in a cluster node script: \
             @user_script:12",
        );
        assert_eq!(cluster_redirect(&moved_away), Some(Redirect::Migrating));
    }

    /// An error reply, as redis-rs parses one off the wire.
    fn reply(text: &str) -> RedisError {
        let value = redis::parse_redis_value(format!("-{text}\r\n").as_bytes()).unwrap();
        value.extract_error().expect_err("an error reply")
    }

    fn io(kind: std::io::ErrorKind, os: Option<i32>) -> RedisError {
        let error = match os {
            Some(code) => std::io::Error::from_raw_os_error(code),
            None => std::io::Error::from(kind),
        };
        RedisError::from(error)
    }

    #[test]
    fn error_replies_become_the_error_a_user_acts_on() {
        let kinds = [
            ("WRONGPASS invalid username-password pair", "Authentication"),
            ("NOAUTH Authentication required.", "Authentication"),
            (
                "NOPERM User x has no permissions to access the 'k' key",
                "Permission",
            ),
            (
                "ERR The user executing the script can't run this command or subcommand",
                "Permission",
            ),
            (
                "ERR The user executing the script can't access at least one of the keys mentioned \
                 in the command arguments script: 1f04, on @user_script:4.",
                "Permission",
            ),
            (
                "ERR ACL failure in script: User u has no permissions to run the 'incr' command \
                 script: 1f04, on @user_script:25.",
                "Permission",
            ),
            (
                "OOM command not allowed when used memory > 'maxmemory'.",
                "OutOfMemory",
            ),
            (
                "WRONGTYPE Operation against a key holding the wrong kind of value",
                "Server",
            ),
        ];
        for (text, expected) in kinds {
            let error = refusal("127.0.0.1:1", &reply(text));
            let name = format!("{error:?}");
            assert!(name.starts_with(expected), "{text} -> {name}");
            assert!(error.to_string().contains("127.0.0.1:1"), "{error}");
            let code = text.split(' ').next().unwrap();
            assert!(error.to_string().contains(code), "{error} names {code}");
        }
    }

    #[test]
    fn an_acl_refusal_that_names_nothing_points_to_acl_log() {
        let unnamed = [
            "NOPERM this user has no permissions to access one of the keys used as arguments",
            "ERR The user executing the script can't run this command or subcommand script: \
             1f04, on @user_script:4.",
        ];
        for text in unnamed {
            let message = refusal("127.0.0.1:1", &reply(text)).to_string();
            assert!(
                message.contains(text) && message.contains("ACL LOG"),
                "{message}"
            );
        }
        let named = "NOPERM this user has no permissions to run the 'eval' command";
        let message = refusal("127.0.0.1:1", &reply(named)).to_string();
        assert!(message.ends_with(named), "{message}");
    }

    #[test]
    fn a_replica_a_loading_or_a_full_redis_loses_the_connection_other_refusals_keep_it() {
        for text in [
            "READONLY x",
            "MASTERDOWN x",
            "LOADING x",
            "ERR max number of clients reached",
        ] {
            assert!(
                !classify(reply(text), false, false).keeps_connection(),
                "{text}"
            );
        }
        for text in [
            "WRONGTYPE x",
            "OOM x",
            "NOPERM x",
            "CLUSTERDOWN x",
            "MOVED 1 h:1",
        ] {
            assert!(
                classify(reply(text), false, false).keeps_connection(),
                "{text}"
            );
        }
        assert!(refusal("a", &reply("LOADING x")).is_transient());
        assert!(!refusal("a", &reply("MOVED 1 h:1")).is_transient());
        assert!(!refusal("a", &reply("NOPERM x")).is_transient());
    }

    #[test]
    fn refused_access_is_credentials_or_acl_and_nothing_else() {
        assert!(is_refused_access(&reply("WRONGPASS nope")));
        assert!(is_refused_access(&reply("NOPERM nope")));
        assert!(!is_refused_access(&reply("OOM full")));
        assert!(!is_refused_access(&io(
            std::io::ErrorKind::ConnectionRefused,
            None
        )));
    }

    #[test]
    fn eintr_is_a_signal_and_goes_to_ruby_only_when_it_must() {
        let eintr = || io(std::io::ErrorKind::Interrupted, Some(libc::EINTR));
        assert!(is_signalled(&eintr()));
        assert!(matches!(
            classify(eintr(), false, false),
            Failure::Signalled(_)
        ));
        assert!(matches!(
            classify(eintr(), true, false),
            Failure::Interrupted
        ));
        assert!(matches!(
            classify(eintr(), false, true),
            Failure::Interrupted
        ));
        assert!(!is_signalled(&io(
            std::io::ErrorKind::ConnectionReset,
            Some(libc::ECONNRESET)
        )));
    }

    #[test]
    fn dropped_connections_timeouts_and_refusals_are_told_apart() {
        let reset = io(std::io::ErrorKind::ConnectionReset, None);
        assert!(matches!(classify(reset, false, false), Failure::Dropped(_)));
        let eof = io(std::io::ErrorKind::UnexpectedEof, None);
        assert!(matches!(classify(eof, false, false), Failure::Dropped(_)));
        let timeout = io(std::io::ErrorKind::WouldBlock, None);
        assert!(matches!(
            classify(timeout, true, false),
            Failure::Unusable(_)
        ));
        let refused = classify(reply("WRONGTYPE x"), true, true);
        assert!(matches!(refused, Failure::Refused(_)) && refused.keeps_connection());
        let parse = RedisError::from((ErrorKind::Parse, "garbled"));
        assert!(matches!(
            classify(parse, false, false),
            Failure::Unusable(_)
        ));
    }

    #[test]
    fn script_replies_say_taken_or_when_to_look_again() {
        assert_eq!(attempt_from(&[1, 42]), Attempt::Acquired(42));
        let held = Attempt::Held {
            retry_in: Some(Duration::from_millis(251)),
        };
        assert_eq!(attempt_from(&[0, 250]), held);
        assert_eq!(attempt_from(&[0, -2]), Attempt::Held { retry_in: None });
        assert_eq!(attempt_from(&[-1, 0]), Attempt::NotQueued);
        assert_eq!(attempt_from(&[]), Attempt::Held { retry_in: None });
    }
}
