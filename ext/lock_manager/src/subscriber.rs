//! Wake-up on release: one subscriber connection per Locker and process, shared by every
//! waiting thread.
//!
//! A background thread holds one connection (outside the pool) subscribed to two things:
//! - this process's own channel, "lock_manager:process:<uuid>", which its waiters give when they
//!   queue: a release that hands the lock to one of them publishes there alone, with the token,
//!   the fencing token and the key, so that no other process wakes for it;
//! - the pattern covering this Locker's prefix, "lock_manager:<prefix>*": the lock's own channel,
//!   for hand-offs to waiters that gave no channel and for "look again" (an empty message).
//!
//! It tells the local thread that now holds the lock (which then needs no round trip to know
//! it), or wakes every local thread waiting for that key. A release by this process tells its
//! own waiter first, from the release script's reply (`handed_over_here`). While it is not
//! subscribed (starting, Redis down) waiters fall back to the backoff; it resubscribes by itself
//! and then wakes everyone, so a release missed meanwhile costs one re-check, not a hang.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crate::connector::Connector;
use crate::gvl;
use crate::keys::{lock_of_channel, KeySpace, PROCESS_CHANNEL_PREFIX};
use crate::per_process::PerProcess;
use crate::replies::{is_refused_access, is_signalled, FencingToken};
use crate::waker::Waker;

/// How long the listening thread blocks on its socket before looking at its stop flag.
const POLL: Duration = Duration::from_millis(500);
/// Pause between two attempts to (re)subscribe while Redis is unreachable.
const RESUBSCRIBE_PAUSE: Duration = Duration::from_millis(200);
/// After Redis refused to let us listen (credentials, channel rights), how long before a waiter
/// starts the listening thread again: such a refusal lasts until someone changes the ACL, and
/// every attempt is a connection and an entry in Redis's ACL log.
const AFTER_REFUSAL: Duration = Duration::from_secs(10);

/// A waiting thread: the token it acquires with, and how to wake it.
struct Waiter {
    token: Vec<u8>,
    waker: Arc<Waker>,
}

/// What a message tells the waiters of one key.
#[derive(Debug, PartialEq)]
pub struct Release<'a> {
    pub key: &'a [u8],
    /// The waiter the lock was handed to; empty: "look again, all of you".
    pub token: &'a [u8],
    /// Its fencing token; `None` when the counter refused one (the waiter then confirms).
    pub fencing_token: Option<FencingToken>,
}

/// A message on a lock's own channel (the key is the channel's): "<token> <fencing token>", or
/// empty.
pub fn parse_lock_message<'a>(key: &'a [u8], message: &'a [u8]) -> Release<'a> {
    let mut words = message.splitn(2, |&byte| byte == b' ');
    let token = words.next().unwrap_or_default();
    Release {
        key,
        token,
        fencing_token: words.next().and_then(parse_fencing_token),
    }
}

/// A message on a process's own channel: "<token> <fencing token> <key>" (the key may hold
/// spaces: it comes last).
pub fn parse_process_message(message: &[u8]) -> Option<Release<'_>> {
    let mut words = message.splitn(3, |&byte| byte == b' ');
    let (token, fencing_token, key) = (words.next()?, words.next()?, words.next()?);
    Some(Release {
        key,
        token,
        fencing_token: parse_fencing_token(fencing_token),
    })
}

fn parse_fencing_token(word: &[u8]) -> Option<FencingToken> {
    std::str::from_utf8(word).ok()?.parse().ok()
}

struct Shared {
    /// The threads of this process waiting for each lock key.
    waiters: Mutex<HashMap<Vec<u8>, Vec<Waiter>>>,
    /// This process's own channel; `None` when the Locker's pattern would cover it (a key
    /// prefix that starts it, such as ""): every process would hear it then.
    channel: Option<Arc<[u8]>>,
    listening: AtomicBool,
    /// Subscribed to `channel` (a user's ACL may allow the pattern only).
    on_own_channel: AtomicBool,
    /// A listening thread runs (or is starting).
    running: AtomicBool,
    /// When Redis last refused to let us listen.
    refused_at: Mutex<Option<Instant>>,
    stop: AtomicBool,
}

impl Shared {
    fn new(channel: Option<Arc<[u8]>>) -> Self {
        Shared {
            waiters: Mutex::default(),
            channel,
            listening: AtomicBool::new(false),
            on_own_channel: AtomicBool::new(false),
            running: AtomicBool::new(false),
            refused_at: Mutex::new(None),
            stop: AtomicBool::new(false),
        }
    }

    /// Whether a listening thread may start: not within `AFTER_REFUSAL` of a refusal.
    fn may_start(&self) -> bool {
        let refused_at = self.refused_at.lock().map(|at| *at).unwrap_or_default();
        refused_at.is_none_or(|at| at.elapsed() >= AFTER_REFUSAL)
    }

    /// Hands the lock to the waiter the release names (a fencing token that is not a number:
    /// wakes it to look), or wakes every waiter of the key.
    fn tell(&self, release: &Release) {
        if let Ok(waiters) = self.waiters.lock() {
            let to_wake = waiters.get(release.key).into_iter().flatten();
            for waiter in to_wake.filter(|w| release.token.is_empty() || w.token == release.token) {
                match release.fencing_token {
                    Some(fencing_token) => waiter.waker.hand_over(fencing_token),
                    None => waiter.waker.wake(),
                }
            }
        }
    }

    fn wake_all(&self) {
        if let Ok(waiters) = self.waiters.lock() {
            waiters.values().flatten().for_each(|w| w.waker.wake());
        }
    }
}

pub struct Subscriber {
    connector: Connector,
    keys: KeySpace,
    pattern: Vec<u8>,
    connect_timeout: Duration,
    /// The listening thread of this process (threads do not survive fork) and its waiters.
    listener: PerProcess<Shared>,
}

/// A thread's interest in one key; dropping it unregisters the thread.
pub struct Registration {
    shared: Arc<Shared>,
    key: Vec<u8>,
    waker: Arc<Waker>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Ok(mut waiters) = self.shared.waiters.lock() {
            if let Some(list) = waiters.get_mut(&self.key) {
                list.retain(|w| !Arc::ptr_eq(&w.waker, &self.waker));
                if list.is_empty() {
                    waiters.remove(&self.key);
                }
            }
        }
    }
}

impl Subscriber {
    /// `connector`: the server whose publications reach us (a Cluster: any node).
    pub fn new(connector: Connector, keys: &KeySpace, connect_timeout: Duration) -> Self {
        Subscriber {
            connector,
            keys: keys.clone(),
            pattern: keys.channel_pattern(),
            connect_timeout,
            listener: PerProcess::new(),
        }
    }

    /// Registers `waker` for releases of `key` (the full Redis key) to `token`, starting the
    /// listening thread on first use in this process.
    pub fn register(&self, key: &[u8], token: &str, waker: &Arc<Waker>) -> Registration {
        let shared = self.this_process();
        if let Ok(mut waiters) = shared.waiters.lock() {
            waiters.entry(key.to_vec()).or_default().push(Waiter {
                token: token.as_bytes().to_vec(),
                waker: Arc::clone(waker),
            });
        }
        Registration {
            shared,
            key: key.to_vec(),
            waker: Arc::clone(waker),
        }
    }

    /// A release by this process handed `key` over with `message`: a waiter of this process it
    /// names hears it now rather than through Redis (the publication that follows is then
    /// news to no one here).
    pub fn handed_over_here(&self, key: &[u8], message: &[u8]) {
        if let Some(shared) = self.listener.get() {
            shared.tell(&parse_lock_message(key, message));
        }
    }

    /// True while releases reach this process: waiters may then wait for them.
    pub fn is_listening(&self) -> bool {
        self.listener
            .get()
            .is_some_and(|shared| shared.listening.load(Ordering::Acquire))
    }

    /// The channel a release that hands a lock to a waiter of this process publishes on, while
    /// this process listens on it; `None`: the lock's own channel.
    pub fn own_channel(&self) -> Option<Arc<[u8]>> {
        let shared = self.listener.get()?;
        let subscribed = shared.on_own_channel.load(Ordering::Acquire);
        shared.channel.clone().filter(|_| subscribed)
    }

    /// A channel for this process alone, unless the pattern covers it.
    fn new_own_channel(&self) -> Option<Arc<[u8]>> {
        let uuid = uuid::Uuid::new_v4().to_string();
        let channel = [PROCESS_CHANNEL_PREFIX, uuid.as_bytes()].concat();
        (!self.keys.pattern_covers(&channel)).then(|| channel.into())
    }

    /// This process's waiters, starting the listening thread on first use here, and again
    /// some time after Redis refused it (it does not retry refusals on its own).
    fn this_process(&self) -> Arc<Shared> {
        let (shared, _) = self
            .listener
            .get_or_create(|| Shared::new(self.new_own_channel()));
        if shared.may_start() && !shared.running.swap(true, Ordering::AcqRel) {
            let listening = Arc::clone(&shared);
            let (client, pattern, timeout) = (
                self.connector.clone(),
                self.pattern.clone(),
                self.connect_timeout,
            );
            let started = thread::Builder::new()
                .name("lock_manager-subscriber".into())
                .spawn(move || {
                    gvl::block_signals_in_this_thread();
                    listen(&listening, &client, &pattern, timeout);
                    listening.running.store(false, Ordering::Release);
                });
            if started.is_err() {
                // No thread: waiters keep to the backoff.
                shared.running.store(false, Ordering::Release);
            }
        }
        shared
    }
}

impl Drop for Subscriber {
    fn drop(&mut self) {
        // The listening thread stops within one poll; an inherited one is forgotten.
        if let Some(shared) = self.listener.get() {
            shared.stop.store(true, Ordering::Release);
        }
    }
}

/// Listens until the Locker goes away, resubscribing while Redis is unreachable; gives up when
/// Redis refuses the credentials or the channels (a wrong password, an ACL): retrying those in
/// the background would only fill Redis's ACL log. A waiter starts it again after
/// `AFTER_REFUSAL`.
fn listen(shared: &Shared, client: &Connector, pattern: &[u8], connect_timeout: Duration) {
    while !shared.stop.load(Ordering::Acquire) {
        match listen_once(shared, client, pattern, connect_timeout) {
            Err(error) if is_refused_access(&error) => {
                if let Ok(mut refused_at) = shared.refused_at.lock() {
                    *refused_at = Some(Instant::now());
                }
                return;
            }
            Err(_unreachable) => thread::sleep(RESUBSCRIBE_PAUSE),
            Ok(()) => {}
        }
    }
}

/// Subscribes and dispatches messages until the connection fails or the Locker goes away.
fn listen_once(
    shared: &Shared,
    client: &Connector,
    pattern: &[u8],
    connect_timeout: Duration,
) -> redis::RedisResult<()> {
    let generation = client.generation();
    let mut conn = client.connect(connect_timeout)?;
    conn.set_read_timeout(Some(POLL))?;
    let on_own_channel = subscribe(&mut conn, pattern, shared.channel.as_deref())?;
    let mut pubsub = conn.as_pubsub();
    shared
        .on_own_channel
        .store(on_own_channel, Ordering::Release);
    shared.listening.store(true, Ordering::Release);
    shared.wake_all(); // whatever was released before we listened: look again
    let outcome = loop {
        // Stopped, or Sentinel named another primary: publications happen there now.
        if shared.stop.load(Ordering::Acquire) || client.generation() != generation {
            break Ok(());
        }
        match pubsub.get_message() {
            Ok(message) => {
                let channel: Vec<u8> = message.get_channel().unwrap_or_default();
                let payload = message.get_payload_bytes();
                if shared.channel.as_deref() == Some(channel.as_slice()) {
                    if let Some(release) = parse_process_message(payload) {
                        shared.tell(&release);
                    }
                } else if let Some(key) = lock_of_channel(&channel) {
                    shared.tell(&parse_lock_message(key, payload));
                }
            }
            // Nothing published for a while, or a stray signal: the reply parser keeps its state.
            Err(error) if error.is_timeout() || is_signalled(&error) => continue,
            Err(error) => break Err(error),
        }
    };
    shared.listening.store(false, Ordering::Release);
    shared.on_own_channel.store(false, Ordering::Release);
    shared.wake_all(); // back to the backoff until subscribed again
    outcome
}

/// Subscribes to `pattern` and to `own_channel` with one write: Redis runs both before any
/// publication reaches us, so their replies come first. Redis refusing the pattern (an ACL) is
/// an error; refusing the own channel only leaves this process on the locks' channels.
/// Returns whether it listens on `own_channel`.
fn subscribe(
    conn: &mut redis::Connection,
    pattern: &[u8],
    own_channel: Option<&[u8]>,
) -> redis::RedisResult<bool> {
    let mut commands = redis::pipe();
    commands.cmd("PSUBSCRIBE").arg(pattern);
    if let Some(channel) = own_channel {
        commands.cmd("SUBSCRIBE").arg(channel);
    }
    conn.send_packed_command(&commands.get_packed_pipeline())?;
    let on_pattern = conn.recv_response()?.extract_error();
    let on_own_channel = match own_channel {
        Some(_) => conn.recv_response()?.extract_error().is_ok(),
        None => false,
    };
    on_pattern?;
    Ok(on_own_channel)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_channel_message_hands_over_or_says_look_again() {
        assert_eq!(
            parse_lock_message(b"lock:k", b"tok 1000000000000042"),
            Release {
                key: b"lock:k",
                token: b"tok",
                fencing_token: Some(1_000_000_000_000_042)
            }
        );
        let look_again = parse_lock_message(b"lock:k", b"");
        assert!(look_again.token.is_empty() && look_again.fencing_token.is_none());
        // The counter refused a token: the waiter is woken to confirm.
        assert_eq!(parse_lock_message(b"k", b"tok -").fencing_token, None);
    }

    #[test]
    fn a_process_channel_message_names_the_key_last_spaces_and_all() {
        let release = parse_process_message(b"tok 7 lock:a key with spaces").unwrap();
        assert_eq!(release.key, b"lock:a key with spaces");
        assert_eq!(
            (release.token, release.fencing_token),
            (&b"tok"[..], Some(7))
        );
        assert_eq!(parse_process_message(b"tok 7"), None);
    }

    #[test]
    fn only_the_named_waiter_is_handed_the_lock() {
        let shared = Shared::new(None);
        let (mine, other) = (Arc::new(Waker::default()), Arc::new(Waker::default()));
        if let Ok(mut waiters) = shared.waiters.lock() {
            let waiter = |token: &[u8], waker: &Arc<Waker>| Waiter {
                token: token.to_vec(),
                waker: Arc::clone(waker),
            };
            waiters.insert(
                b"k".to_vec(),
                vec![waiter(b"a", &mine), waiter(b"b", &other)],
            );
        }
        shared.tell(&parse_lock_message(b"k", b"a 9"));
        assert_eq!((mine.take_handed(), other.take_handed()), (Some(9), None));
        assert!(!other.take_woken());
        shared.tell(&parse_lock_message(b"k", b""));
        assert!(mine.take_woken() && other.take_woken());
    }
}
