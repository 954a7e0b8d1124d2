//! Every Redis key and pub/sub channel name the gem uses, defined once. The Lua scripts are given
//! these by Rust (`scripts.rs` prepends them), never as literals of their own.
//!
//! A lock's own key is `key_prefix + key`, where users and their monitoring look for it. Every
//! other key (a lock's queue and waiters, the fencing counters) lives under `INTERNAL_PREFIX`,
//! which no `key_prefix + key` can reach: a prefix that is empty, or that starts (or is the start
//! of) `INTERNAL_PREFIX`, is refused. Each internal key carries a hash tag that Redis Cluster
//! maps to the lock key's own slot, so every key one command touches lies in one slot, whatever
//! the key holds (braces, `}` before `{`, binary, megabytes).

use std::sync::LazyLock;

/// Where every internal key starts.
pub const INTERNAL_PREFIX: &[u8] = b"lock_manager:";

/// The prefix of the channel a lock's releases are published on; the lock key follows it.
pub const CHANNEL_PREFIX: &[u8] = b"lock_manager:";

/// Where a process's own channel starts; a uuid follows. A release that hands a lock to a waiter
/// of that process publishes there alone.
pub const PROCESS_CHANNEL_PREFIX: &[u8] = b"lock_manager:process:";

/// Redis Cluster's number of hash slots.
pub const SLOTS: u16 = 16_384;

/// Why a key prefix cannot be used, or `None`.
pub fn prefix_problem(prefix: &[u8]) -> Option<String> {
    let internal = String::from_utf8_lossy(INTERNAL_PREFIX);
    if prefix.is_empty() {
        return Some(format!(
            "key_prefix must not be empty: locks would share Redis's whole keyspace with \"{internal}\", \
             where lock_manager keeps its own keys"
        ));
    }
    if prefix.starts_with(INTERNAL_PREFIX) || INTERNAL_PREFIX.starts_with(prefix) {
        return Some(format!(
            "key_prefix {:?} would reach \"{internal}\", where lock_manager keeps its own keys: \
             choose another (the default is \"lock:\")",
            String::from_utf8_lossy(prefix)
        ));
    }
    None
}

/// The hash slot of `key`, as Redis Cluster computes it: CRC16 of the hash tag (what lies between
/// the first `{` and the first `}` after it, when not empty), else of the whole key.
pub fn hash_slot(key: &[u8]) -> u16 {
    let hashed = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(key);
    crc16(hashed) % SLOTS
}

/// CRC16-CCITT (XModem), the checksum Redis Cluster uses.
fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in bytes {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// For every slot, a short hash tag that Redis maps to it: the first string of 1 to 3 characters
/// from `TAG_ALPHABET` that does (all 16,384 slots are reached by three).
static SLOT_TAGS: LazyLock<Vec<Box<[u8]>>> = LazyLock::new(|| {
    let mut tags: Vec<Option<Box<[u8]>>> = vec![None; usize::from(SLOTS)];
    let mut left = usize::from(SLOTS);
    'lengths: for length in 1..=3u32 {
        let count = TAG_ALPHABET.len().pow(length);
        for mut n in 0..count {
            let mut tag = Vec::with_capacity(length as usize);
            for _ in 0..length {
                tag.push(TAG_ALPHABET[n % TAG_ALPHABET.len()]);
                n /= TAG_ALPHABET.len();
            }
            let slot = &mut tags[usize::from(crc16(&tag) % SLOTS)];
            if slot.is_none() {
                *slot = Some(tag.into());
                left -= 1;
                if left == 0 {
                    break 'lengths;
                }
            }
        }
    }
    tags.into_iter()
        .map(|tag| tag.expect("three characters reach every slot"))
        .collect()
});

const TAG_ALPHABET: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";

/// The hash tag, braces included, of the internal keys of slot `slot`.
fn slot_tag(slot: u16) -> Vec<u8> {
    [&b"{"[..], &SLOT_TAGS[usize::from(slot)], b"}"].concat()
}

/// The fencing counter of the slot whose hash tag (braces included) is `tag`.
fn fencing_counter_of(tag: &[u8]) -> Vec<u8> {
    [INTERNAL_PREFIX, tag, b":fencing"].concat()
}

/// The names of one Locker's keys: `key_prefix` + the key for a lock, and what hangs off it.
#[derive(Clone)]
pub struct KeySpace {
    prefix: Vec<u8>,
}

/// The Redis keys of one lock: the lock, its queue of waiters, and their details; and the
/// fencing counter of its slot. All in the lock's hash slot.
pub struct LockKeys {
    pub lock: Vec<u8>,
    pub queue: Vec<u8>,
    pub waiters: Vec<u8>,
    pub fencing: Vec<u8>,
}

impl LockKeys {
    /// KEYS of the queue scripts (see `lua/shared/queue.lua`).
    pub fn all(&self) -> [&[u8]; 4] {
        [&self.lock, &self.queue, &self.waiters, &self.fencing]
    }
}

impl KeySpace {
    /// `Err`: the prefix cannot be used (see `prefix_problem`).
    pub fn new(prefix: &[u8]) -> Result<Self, String> {
        match prefix_problem(prefix) {
            Some(problem) => Err(problem),
            None => Ok(KeySpace {
                prefix: prefix.to_vec(),
            }),
        }
    }

    pub fn prefix(&self) -> &[u8] {
        &self.prefix
    }

    /// The lock's own key: what users and their monitoring see.
    pub fn lock(&self, key: &[u8]) -> Vec<u8> {
        [self.prefix.as_slice(), key].concat()
    }

    /// The fencing counter of the slot of the lock key `lock`: every acquisition of every key
    /// of that slot draws from it, so a key's tokens only grow.
    pub fn fencing_counter(lock: &[u8]) -> Vec<u8> {
        fencing_counter_of(&slot_tag(hash_slot(lock)))
    }

    /// Every key a lock's queue scripts touch.
    pub fn lock_keys(&self, key: &[u8]) -> LockKeys {
        let lock = self.lock(key);
        let tag = slot_tag(hash_slot(&lock));
        let internal = |kind: &[u8]| [INTERNAL_PREFIX, &tag, kind, &lock].concat();
        LockKeys {
            queue: internal(b":queue:"),
            waiters: internal(b":waiters:"),
            fencing: fencing_counter_of(&tag),
            lock,
        }
    }

    /// The jobs parked on the lock `key` (see `parking.rs`), in the lock's slot.
    pub fn parked(&self, key: &[u8]) -> Vec<u8> {
        self.beside_lock(b":parked:", key)
    }

    /// Where the push of the job that holds the lock `key` is remembered, for a job that may replace
    /// it (`lua/claim_push.lua`), in the lock's slot.
    pub fn pending(&self, key: &[u8]) -> Vec<u8> {
        self.beside_lock(b":pending:", key)
    }

    /// One internal key of the lock `key`, named by `kind`, in the lock's slot (as `lock_keys`
    /// names its queue and waiters).
    fn beside_lock(&self, kind: &[u8], key: &[u8]) -> Vec<u8> {
        let lock = self.lock(key);
        let tag = slot_tag(hash_slot(&lock));
        [INTERNAL_PREFIX, &tag, kind, &lock].concat()
    }

    /// The key of the limiter `name` of kind `kind` (`limits.rs`): internal, so that no lock key
    /// reaches it, in the slot `key_prefix + name` would have, one key per limiter.
    pub fn limiter(&self, kind: &[u8], name: &[u8]) -> Vec<u8> {
        let full = self.lock(name);
        let tag = slot_tag(hash_slot(&full));
        [INTERNAL_PREFIX, &tag, b":limit:", kind, b":", &full].concat()
    }

    /// The SCAN MATCH pattern of this prefix's limiters of every kind whose names match
    /// `pattern` (a glob).
    pub fn limiter_pattern(&self, pattern: &[u8]) -> Vec<u8> {
        [
            INTERNAL_PREFIX,
            b"{*}:limit:*:",
            &glob_escape(&self.prefix),
            pattern,
        ]
        .concat()
    }

    /// The kind and name of the limiter whose key is `key` (`limiter`'s inverse), or `None` for a
    /// key that is not one of this prefix's limiters.
    pub fn limiter_of<'k>(&self, key: &'k [u8]) -> Option<(&'k [u8], &'k [u8])> {
        let rest = key.strip_prefix(INTERNAL_PREFIX)?;
        let close = rest.iter().position(|&b| b == b'}')?;
        let rest = rest[close + 1..].strip_prefix(b":limit:")?;
        let colon = rest.iter().position(|&b| b == b':')?;
        let (kind, name) = (
            &rest[..colon],
            rest[colon + 1..].strip_prefix(self.prefix())?,
        );
        (self.limiter(kind, name) == key).then_some((kind, name))
    }

    /// The PSUBSCRIBE pattern that covers the channels of every lock of this prefix, with the
    /// prefix's glob characters escaped.
    pub fn channel_pattern(&self) -> Vec<u8> {
        [CHANNEL_PREFIX, &glob_escape(&self.prefix), b"*"].concat()
    }

    /// The SCAN MATCH pattern of this prefix's keys that `pattern` (a glob over keys without the
    /// prefix) matches, with the prefix's glob characters escaped.
    pub fn key_pattern(&self, pattern: &[u8]) -> Vec<u8> {
        [&glob_escape(&self.prefix), pattern].concat()
    }

    /// Whether `channel` is one the pattern covers: a process channel must not be, or every
    /// process would hear its hand-offs.
    pub fn pattern_covers(&self, channel: &[u8]) -> bool {
        channel
            .strip_prefix(CHANNEL_PREFIX)
            .is_some_and(|rest| rest.starts_with(&self.prefix))
    }
}

/// `text` as a glob that matches only itself.
fn glob_escape(text: &[u8]) -> Vec<u8> {
    let mut escaped = Vec::with_capacity(text.len());
    for &byte in text {
        if matches!(byte, b'*' | b'?' | b'[' | b']' | b'\\') {
            escaped.push(b'\\');
        }
        escaped.push(byte);
    }
    escaped
}

/// The lock key a lock channel is about, or `None` for another channel.
pub fn lock_of_channel(channel: &[u8]) -> Option<&[u8]> {
    channel.strip_prefix(CHANNEL_PREFIX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_slots_are_redis_clusters() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(hash_slot(b"foo"), 12_182);
        assert_eq!(hash_slot(b"bar"), 5_061);
        assert_eq!(hash_slot(b"{user1000}.following"), hash_slot(b"user1000"));
        assert_eq!(hash_slot(b"foo{}{bar}"), hash_slot(b"foo{}{bar}")); // empty tag: whole key
        assert_ne!(hash_slot(b"foo{}{bar}"), hash_slot(b"bar"));
        assert_eq!(hash_slot(b"foo{{bar}}zap"), hash_slot(b"{bar"));
        assert_eq!(hash_slot(b"foo{bar}{zap}"), hash_slot(b"bar"));
        assert_eq!(hash_slot(b"}{x}"), hash_slot(b"x"));
    }

    #[test]
    fn every_slot_has_a_tag_that_maps_to_it() {
        for slot in 0..SLOTS {
            let tag = slot_tag(slot);
            assert_eq!(hash_slot(&[&b"x"[..], &tag, b"y"].concat()), slot);
            assert!(tag.len() <= 5);
        }
    }

    #[test]
    fn a_locks_keys_share_its_slot_whatever_the_key() {
        let space = KeySpace::new(b"lock:").unwrap();
        let big = vec![b'}'; 1 << 20];
        let keys: [&[u8]; 8] = [
            b"job",
            b"{tag}rest",
            b"}{x}",
            b"{}",
            b"a{}b{c}",
            b"\xff\x00{",
            &big,
            b"x:queue",
        ];
        for key in keys {
            let all = space.lock_keys(key);
            let slot = hash_slot(&all.lock);
            for internal in all.all() {
                assert_eq!(hash_slot(internal), slot);
            }
            assert_eq!(KeySpace::fencing_counter(&all.lock), all.fencing);
            assert_eq!(hash_slot(&space.limiter(b"window", key)), slot);
        }
    }

    #[test]
    fn internal_keys_are_out_of_reach_of_every_lock_key() {
        let space = KeySpace::new(b"lock:").unwrap();
        let internal = space.lock_keys(b"x");
        let limiter = space.limiter(b"gcra", b"x");
        for name in [
            &internal.queue,
            &internal.waiters,
            &internal.fencing,
            &limiter,
        ] {
            assert!(name.starts_with(INTERNAL_PREFIX) && !name.starts_with(b"lock:"));
        }
        assert!(KeySpace::new(b"").is_err());
        assert!(KeySpace::new(b"lock_manager:").is_err());
        assert!(KeySpace::new(b"lock_manager:mine:").is_err());
        assert!(KeySpace::new(b"lock_").is_err());
        assert!(KeySpace::new(b"lock_managers:").is_ok());
        assert!(KeySpace::new(b"locks:").is_ok());
    }

    #[test]
    fn a_limiters_key_gives_back_its_kind_and_name() {
        let space = KeySpace::new(b"lock:").unwrap();
        for name in [&b"x"[..], b"a}:limit:gcra:lock:b", b"{t}y", b""] {
            let key = space.limiter(b"window", name);
            assert_eq!(space.limiter_of(&key), Some((&b"window"[..], name)));
        }
        let other = KeySpace::new(b"other:").unwrap();
        assert_eq!(other.limiter_of(&space.limiter(b"gcra", b"x")), None);
        assert_eq!(space.limiter_of(&space.lock_keys(b"x").queue), None);
        assert_eq!(
            space.limiter_pattern(b"r*"),
            b"lock_manager:{*}:limit:*:lock:r*"
        );
    }

    #[test]
    fn a_key_pattern_matches_the_prefix_only_as_itself() {
        assert_eq!(
            KeySpace::new(b"lock:").unwrap().key_pattern(b"r*"),
            b"lock:r*"
        );
        let space = KeySpace::new(b"a*b?[c]\\").unwrap();
        assert_eq!(space.key_pattern(b"r*"), b"a\\*b\\?\\[c\\]\\\\r*");
    }

    #[test]
    fn the_channel_pattern_escapes_the_prefixs_glob_characters() {
        let space = KeySpace::new(b"a*b?[c]\\").unwrap();
        assert_eq!(
            space.channel_pattern(),
            b"lock_manager:a\\*b\\?\\[c\\]\\\\*"
        );
    }

    #[test]
    fn process_channels_are_covered_only_by_prefixes_that_start_them() {
        let channel = [PROCESS_CHANNEL_PREFIX, b"1234"].concat();
        assert!(!KeySpace::new(b"lock:").unwrap().pattern_covers(&channel));
        assert!(KeySpace::new(b"proc").unwrap().pattern_covers(&channel));
        assert!(!KeySpace::new(b"processes")
            .unwrap()
            .pattern_covers(&channel));
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
