//! Wake-up on release: one subscriber connection per Locker and process, shared by every
//! waiting thread.
//!
//! The release scripts publish on "lock_manager:<lock key>", with the token the lock was handed
//! to and its fencing token (or nothing: "look again"). A background thread holds one connection
//! (outside the pool) subscribed to the pattern covering this Locker's prefix, and tells the
//! local thread that now holds the lock (which then needs no round trip to know it), or wakes
//! every local thread waiting for that key. A release by this process tells its own waiter
//! first, from the release script's reply (`handed_over_here`). While it is not subscribed
//! (starting, Redis down) waiters fall back to the backoff; it resubscribes by itself and then
//! wakes everyone, so a release missed meanwhile costs one re-check, not a hang.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use crate::gvl::{self, Waker};
use crate::per_process::PerProcess;
use crate::pool::{is_refused_access, is_signalled};
use crate::scripts::CHANNEL_PREFIX;

/// How long the listening thread blocks on its socket before looking at its stop flag.
const POLL: Duration = Duration::from_millis(500);
/// Pause between two attempts to (re)subscribe while Redis is unreachable.
const RESUBSCRIBE_PAUSE: Duration = Duration::from_millis(200);

/// A waiting thread: the token it acquires with, and how to wake it.
struct Waiting {
    token: Vec<u8>,
    waker: Arc<Waker>,
}

#[derive(Default)]
struct Shared {
    /// The threads of this process waiting for each lock key.
    waiters: Mutex<HashMap<Vec<u8>, Vec<Waiting>>>,
    listening: AtomicBool,
    /// A listening thread runs (or is starting).
    running: AtomicBool,
    stop: AtomicBool,
}

impl Shared {
    /// Acts on a release of `key`: `message` "<token> <fencing token>" hands the lock to the
    /// waiter with that token (a token alone: wakes it to look), an empty one wakes every
    /// waiter of `key`.
    fn released(&self, key: &[u8], message: &[u8]) {
        let mut words = message.splitn(2, |&byte| byte == b' ');
        let token = words.next().unwrap_or_default();
        let fencing_token = words
            .next()
            .and_then(|word| std::str::from_utf8(word).ok()?.parse::<u64>().ok());
        if let Ok(waiters) = self.waiters.lock() {
            let to_wake = waiters.get(key).into_iter().flatten();
            for waiting in to_wake.filter(|w| token.is_empty() || w.token == token) {
                match fencing_token {
                    Some(fencing_token) => waiting.waker.hand_over(fencing_token),
                    None => waiting.waker.wake(),
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
    client: redis::Client,
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
    pub fn new(client: redis::Client, key_prefix: &[u8], connect_timeout: Duration) -> Self {
        let mut pattern = CHANNEL_PREFIX.to_vec();
        for byte in key_prefix {
            if matches!(byte, b'*' | b'?' | b'[' | b']' | b'\\') {
                pattern.push(b'\\');
            }
            pattern.push(*byte);
        }
        pattern.push(b'*');
        Subscriber {
            client,
            pattern,
            connect_timeout,
            listener: PerProcess::new(),
        }
    }

    /// Registers `waker` for releases of `key` (the full Redis key) to `token`, starting the
    /// listening thread on first use in this process.
    pub fn register(&self, key: &[u8], token: &str, waker: &Arc<Waker>) -> Registration {
        let shared = self.this_process();
        if let Ok(mut waiters) = shared.waiters.lock() {
            waiters.entry(key.to_vec()).or_default().push(Waiting {
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
            shared.released(key, message);
        }
    }

    /// True while releases reach this process: waiters may then wait for them.
    pub fn is_listening(&self) -> bool {
        self.listener
            .get()
            .is_some_and(|shared| shared.listening.load(Ordering::Acquire))
    }

    /// This process's waiters, starting the listening thread on first use here, and again
    /// after Redis refused its credentials (it does not retry those on its own).
    fn this_process(&self) -> Arc<Shared> {
        let (shared, _) = self.listener.get_or_create(Shared::default);
        if !shared.running.swap(true, Ordering::AcqRel) {
            let listening = Arc::clone(&shared);
            let (client, pattern, timeout) = (
                self.client.clone(),
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
/// the background would only fill Redis's ACL log. The next waiter starts it again.
fn listen(shared: &Shared, client: &redis::Client, pattern: &[u8], connect_timeout: Duration) {
    while !shared.stop.load(Ordering::Acquire) {
        match listen_once(shared, client, pattern, connect_timeout) {
            Err(error) if is_refused_access(&error) => return,
            Err(_unreachable) => thread::sleep(RESUBSCRIBE_PAUSE),
            Ok(()) => {}
        }
    }
}

/// Subscribes and dispatches messages until the connection fails or the Locker goes away.
fn listen_once(
    shared: &Shared,
    client: &redis::Client,
    pattern: &[u8],
    connect_timeout: Duration,
) -> redis::RedisResult<()> {
    let mut conn = client.get_connection_with_timeout(connect_timeout)?;
    let mut pubsub = conn.as_pubsub();
    pubsub.set_read_timeout(Some(POLL))?;
    pubsub.psubscribe(pattern)?;
    shared.listening.store(true, Ordering::Release);
    shared.wake_all(); // whatever was released before we listened: look again
    let outcome = loop {
        if shared.stop.load(Ordering::Acquire) {
            break Ok(());
        }
        match pubsub.get_message() {
            Ok(message) => {
                let channel: Vec<u8> = message.get_channel().unwrap_or_default();
                if let Some(key) = channel.strip_prefix(CHANNEL_PREFIX) {
                    shared.released(key, message.get_payload_bytes());
                }
            }
            // Nothing published for a while, or a stray signal: the reply parser keeps its state.
            Err(error) if error.is_timeout() || is_signalled(&error) => continue,
            Err(error) => break Err(error),
        }
    };
    shared.listening.store(false, Ordering::Release);
    shared.wake_all(); // back to the backoff until subscribed again
    outcome
}
