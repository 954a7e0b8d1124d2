//! The token an acquisition holds a lock with, defined once: it says who holds the lock and since
//! when, to anyone who reads the lock in Redis (`LockManager::Admin`, `redis-cli GET`). It is the
//! value the acquire's SET writes anyway, so knowing the holder costs no command, no round trip.
//!
//! `<host>/<pid>/<thread>/<since>/<random>`, and `/<limit>` after it for a `limit: N` semaphore:
//! - `host`: this machine's host name, cut to `HOST_MAX` bytes, every byte but `[A-Za-z0-9._-]`
//!   made `_` (a token must hold no space: release messages are split at spaces, see
//!   `subscriber.rs`; and no `/`, so that the fields split);
//! - `pid`: the process id; `thread`: the OS thread id (Ruby's `Thread#native_thread_id`);
//! - `since`: Unix time in ms, from this machine's clock, when the token was made: when the lock
//!   was asked for (for a lock taken after a wait, when the wait began);
//! - `random`: 64 random bits as 16 hex digits, which keep tokens unique where host, pid, thread
//!   and millisecond coincide (containers with the same host name and pid 1);
//! - `limit`: the semaphore's N, as the holder asked for it (Redis keeps no N of its own).
//!
//! A token not of this form (a job's id, which holds the enqueue locks of unique jobs; a lock
//! taken by an older version) parses as `None`.

use std::cell::Cell;
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::per_process::current_pid;

/// Longest host name a token carries.
pub const HOST_MAX: usize = 64;

const RANDOM_DIGITS: usize = 16;

/// What a token says about its holder.
#[derive(Debug, PartialEq, Eq)]
pub struct Holder<'a> {
    pub host: &'a str,
    pub pid: u32,
    pub thread: u64,
    /// Unix time in ms.
    pub since_ms: u64,
    /// The semaphore's N; `None` for a plain lock.
    pub limit: Option<u32>,
}

/// A fresh token for an acquisition by the calling thread, now (`limit` > 1: a semaphore's).
pub fn new_token(limit: u32) -> String {
    format_token(
        host(),
        current_pid(),
        thread_id(),
        unix_ms(),
        fastrand::u64(..),
        limit,
    )
}

/// The token of these fields (see the module's documentation).
pub fn format_token(
    host: &str,
    pid: u32,
    thread: u64,
    since_ms: u64,
    random: u64,
    limit: u32,
) -> String {
    // Written field by field, not through `format!`: this runs for every lock taken, and the
    // formatting machinery cost about 1,500 instructions of an uncontended cycle.
    let mut token = String::with_capacity(host.len() + 64);
    let mut digits = itoa::Buffer::new();
    token.push_str(host);
    for number in [u64::from(pid), thread, since_ms] {
        token.push('/');
        token.push_str(digits.format(number));
    }
    token.push('/');
    for shift in (0..RANDOM_DIGITS).rev() {
        let nibble = ((random >> (shift * 4)) & 0xf) as u8;
        token.push(char::from(if nibble < 10 {
            b'0' + nibble
        } else {
            b'a' + nibble - 10
        }));
    }
    if limit > 1 {
        token.push('/');
        token.push_str(digits.format(limit));
    }
    token
}

/// The holder a token names, or `None` when it is not a token of this form.
pub fn parse(token: &[u8]) -> Option<Holder<'_>> {
    let token = std::str::from_utf8(token).ok()?;
    let mut fields = token.split('/');
    let host = fields.next().filter(|h| is_host(h))?;
    let pid = number(fields.next()?)?;
    let thread = number(fields.next()?)?;
    let since_ms = number(fields.next()?)?;
    let random = fields.next()?;
    if random.len() != RANDOM_DIGITS
        || !random
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    {
        return None;
    }
    let limit = match fields.next() {
        Some(limit) => Some(number::<u32>(limit).filter(|&n| n > 1)?),
        None => None,
    };
    if fields.next().is_some() {
        return None;
    }
    Some(Holder {
        host,
        pid,
        thread,
        since_ms,
        limit,
    })
}

/// Digits only (no sign, no spaces), as `format_token` writes them.
fn number<T: std::str::FromStr>(field: &str) -> Option<T> {
    let digits = !field.is_empty() && field.bytes().all(|b| b.is_ascii_digit());
    digits.then(|| field.parse().ok()).flatten()
}

fn is_host(host: &str) -> bool {
    !host.is_empty() && host.len() <= HOST_MAX && host.bytes().all(is_host_byte)
}

fn is_host_byte(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'_' | b'-')
}

/// A host name as a token carries it.
pub fn clean_host(name: &[u8]) -> String {
    let cleaned: String = name
        .iter()
        .take(HOST_MAX)
        .map(|&b| if is_host_byte(b) { char::from(b) } else { '_' })
        .collect();
    if cleaned.is_empty() {
        "unknown".to_owned()
    } else {
        cleaned
    }
}

/// This machine's host name, read once (a fork keeps it).
fn host() -> &'static str {
    static HOST: OnceLock<String> = OnceLock::new();
    HOST.get_or_init(|| {
        let mut buffer = [0u8; 256];
        // SAFETY: the buffer is writable for its length; gethostname NUL-terminates within it
        // or truncates, and we stop at the first NUL either way.
        let ok = unsafe { libc::gethostname(buffer.as_mut_ptr().cast(), buffer.len()) } == 0;
        let name = if ok {
            let end = buffer.iter().position(|&b| b == 0).unwrap_or(buffer.len());
            &buffer[..end]
        } else {
            &[][..]
        };
        clean_host(name)
    })
}

thread_local! {
    /// The calling thread's OS id, and the process it was read in: the thread that forks is
    /// another thread, with another id, in the child.
    static THREAD_ID: Cell<(u32, u64)> = const { Cell::new((0, 0)) };
}

/// The calling thread's OS id, asked of the kernel once per thread (and again after a fork).
fn thread_id() -> u64 {
    let pid = current_pid();
    THREAD_ID.with(|cached| {
        let (seen_in, id) = cached.get();
        if seen_in == pid {
            return id;
        }
        let id = os_thread_id();
        cached.set((pid, id));
        id
    })
}

#[cfg(target_os = "linux")]
fn os_thread_id() -> u64 {
    // SAFETY: gettid takes no arguments and cannot fail.
    unsafe { libc::syscall(libc::SYS_gettid) as u64 }
}

#[cfg(target_vendor = "apple")]
fn os_thread_id() -> u64 {
    let mut id = 0u64;
    // SAFETY: 0 names the calling thread; `id` is a valid place for the answer.
    unsafe { libc::pthread_threadid_np(0, &mut id) };
    id
}

#[cfg(not(any(target_os = "linux", target_vendor = "apple")))]
fn os_thread_id() -> u64 {
    0
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|since| since.as_millis() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_names_its_holder() {
        let token = format_token("web-1.example.com", 4242, 4250, 1_763_803_362_123, 0xabc, 1);
        assert_eq!(
            token,
            "web-1.example.com/4242/4250/1763803362123/0000000000000abc"
        );
        assert_eq!(
            parse(token.as_bytes()),
            Some(Holder {
                host: "web-1.example.com",
                pid: 4242,
                thread: 4250,
                since_ms: 1_763_803_362_123,
                limit: None,
            })
        );
    }

    #[test]
    fn a_semaphore_token_carries_its_limit() {
        let token = format_token("h", 1, 2, 3, u64::MAX, 5);
        assert_eq!(token, "h/1/2/3/ffffffffffffffff/5");
        assert_eq!(parse(token.as_bytes()).unwrap().limit, Some(5));
    }

    #[test]
    fn a_fresh_token_is_this_threads_now_and_unique() {
        let before = unix_ms();
        let (a, b) = (new_token(1), new_token(3));
        let holder = parse(a.as_bytes()).unwrap();
        assert_eq!(holder.pid, std::process::id());
        assert_eq!(holder.thread, thread_id());
        assert!(holder.since_ms >= before && holder.since_ms <= unix_ms());
        assert_eq!(holder.host, host());
        assert_eq!(parse(b.as_bytes()).unwrap().limit, Some(3));
        assert_ne!(a, new_token(1));
        assert!(!a.contains(' '));
        let other = std::thread::spawn(|| parse(new_token(1).as_bytes()).unwrap().thread);
        assert_ne!(other.join().unwrap(), holder.thread);
    }

    #[test]
    fn other_tokens_name_no_holder() {
        for token in [
            &b"b9c1a1f0e2d34c5e6f7a8b9c"[..],        // a Sidekiq jid
            b"3f2a5c1e-8d4b-4e6f-9a0b-1c2d3e4f5a6b", // an ActiveJob job_id, an older token
            b"",
            b"h/1/2/3",                      // too few fields
            b"h/1/2/3/0000000000000abc/5/6", // too many
            b"h/1/2/3/0000000000000ABC",     // upper-case random
            b"h/1/2/3/abc",                  // short random
            b"h/-1/2/3/0000000000000abc",    // signed
            b"h/1/2/+3/0000000000000abc",
            b"h/1/2/3/0000000000000abc/1", // a limit of 1 is never written
            b"h/1/2/3/0000000000000abc/x",
            b"/1/2/3/0000000000000abc",            // no host
            b"a b/1/2/3/0000000000000abc",         // a space
            b"h/99999999999/2/3/0000000000000abc", // pid beyond u32
            b"\xff/1/2/3/0000000000000abc",
        ] {
            assert_eq!(parse(token), None, "{:?}", String::from_utf8_lossy(token));
        }
    }

    #[test]
    fn host_names_are_cleaned_and_cut() {
        assert_eq!(clean_host(b"web-1.example.com"), "web-1.example.com");
        assert_eq!(clean_host(b"my host/x"), "my_host_x");
        assert_eq!(clean_host(b""), "unknown");
        assert_eq!(clean_host(&[b'a'; 300]).len(), HOST_MAX);
        assert!(is_host(&clean_host("héllo wörld".as_bytes())));
    }
}
