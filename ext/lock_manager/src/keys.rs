//! Every Redis key and pub/sub channel name the gem uses, defined once. The Lua scripts are given
//! these by Rust (`scripts.rs` prepends them), never as literals of their own.

/// The prefix of the channel a lock's releases are published on; the lock key follows it.
pub const CHANNEL_PREFIX: &[u8] = b"lock_manager:";

/// Where a process's own channel starts; a uuid follows. A release that hands a lock to a waiter
/// of that process publishes there alone.
pub const PROCESS_CHANNEL_PREFIX: &[u8] = b"lock_manager:process:";

/// The fencing counter's name, after the key prefix: reserved, like the ":queue" and ":waiters"
/// suffixes.
const FENCING_COUNTER: &[u8] = b"lock_manager:fencing_token";

/// The names of one Locker's keys: `key_prefix` + the key for a lock, and what hangs off it.
#[derive(Clone)]
pub struct KeySpace {
    prefix: Vec<u8>,
    /// The fencing counter's full key (built once: every acquire names it).
    fencing_counter: Vec<u8>,
}

/// The Redis keys of one plain lock: the lock, its queue of waiters, and their details; and the
/// fencing counter.
pub struct LockKeys {
    pub lock: Vec<u8>,
    pub queue: Vec<u8>,
    pub waiters: Vec<u8>,
    pub fencing: Vec<u8>,
}

impl LockKeys {
    /// KEYS of the plain-lock scripts (see `lua/shared/queue.lua`).
    pub fn all(&self) -> [&[u8]; 4] {
        [&self.lock, &self.queue, &self.waiters, &self.fencing]
    }
}

impl KeySpace {
    pub fn new(prefix: &[u8]) -> Self {
        KeySpace {
            prefix: prefix.to_vec(),
            fencing_counter: [prefix, FENCING_COUNTER].concat(),
        }
    }

    pub fn prefix(&self) -> &[u8] {
        &self.prefix
    }

    /// The lock's own key: what users and their monitoring see.
    pub fn lock(&self, key: &[u8]) -> Vec<u8> {
        [self.prefix.as_slice(), key].concat()
    }

    pub fn fencing_counter(&self) -> &[u8] {
        &self.fencing_counter
    }

    /// Every key a plain lock's scripts touch.
    pub fn lock_keys(&self, key: &[u8]) -> LockKeys {
        let lock = self.lock(key);
        LockKeys {
            queue: [lock.as_slice(), b":queue"].concat(),
            waiters: [lock.as_slice(), b":waiters"].concat(),
            fencing: self.fencing_counter.clone(),
            lock,
        }
    }

    /// The PSUBSCRIBE pattern that covers the channels of every lock of this prefix, with the
    /// prefix's glob characters escaped.
    pub fn channel_pattern(&self) -> Vec<u8> {
        let mut pattern = CHANNEL_PREFIX.to_vec();
        for byte in &self.prefix {
            if matches!(byte, b'*' | b'?' | b'[' | b']' | b'\\') {
                pattern.push(b'\\');
            }
            pattern.push(*byte);
        }
        pattern.push(b'*');
        pattern
    }

    /// Whether `channel` is one the pattern covers: a process channel must not be, or every
    /// process would hear its hand-offs.
    pub fn pattern_covers(&self, channel: &[u8]) -> bool {
        channel.starts_with(CHANNEL_PREFIX)
            && channel[CHANNEL_PREFIX.len()..].starts_with(&self.prefix)
    }
}

/// The lock key a lock channel is about, or `None` for another channel.
pub fn lock_of_channel(channel: &[u8]) -> Option<&[u8]> {
    channel.strip_prefix(CHANNEL_PREFIX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_lock_has_its_queue_and_waiters_beside_it_and_the_prefix_counter() {
        let keys = KeySpace::new(b"lock:").lock_keys(b"job");
        assert_eq!(
            keys.all(),
            [
                &b"lock:job"[..],
                b"lock:job:queue",
                b"lock:job:waiters",
                b"lock:lock_manager:fencing_token"
            ]
        );
    }

    #[test]
    fn the_channel_pattern_escapes_the_prefixs_glob_characters() {
        let space = KeySpace::new(b"a*b?[c]\\");
        assert_eq!(
            space.channel_pattern(),
            b"lock_manager:a\\*b\\?\\[c\\]\\\\*"
        );
        assert_eq!(KeySpace::new(b"").channel_pattern(), b"lock_manager:*");
    }

    #[test]
    fn process_channels_are_covered_only_by_prefixes_that_start_them() {
        let channel = [PROCESS_CHANNEL_PREFIX, b"1234"].concat();
        assert!(!KeySpace::new(b"lock:").pattern_covers(&channel));
        assert!(KeySpace::new(b"").pattern_covers(&channel));
        assert!(KeySpace::new(b"proc").pattern_covers(&channel));
        assert!(!KeySpace::new(b"processes").pattern_covers(&channel));
    }

    #[test]
    fn a_lock_channel_names_its_key() {
        assert_eq!(
            lock_of_channel(b"lock_manager:lock:x"),
            Some(&b"lock:x"[..])
        );
        assert_eq!(lock_of_channel(b"other"), None);
    }
}
