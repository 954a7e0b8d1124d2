//! Every Lua script the gem sends to Redis, the EVALSHA-then-EVAL call that runs them, and the
//! one acquire that needs no script (`acquire`: SET NX PX and INCR, pipelined).
//!
//! The scripts live in `lua/`, their shared helpers in `lua/shared/`; each script is its helpers
//! and its body joined at build time, after a preamble through which Rust gives them the names
//! and numbers they share with it (`keys.rs`). Keys and values reach Lua only through KEYS and
//! ARGV, never by string building. What each script takes and returns is said at its top.

use std::sync::LazyLock;

use redis::{
    ConnectionLike, ErrorKind, FromRedisValue, RedisError, RedisResult, ServerErrorKind, Value,
};

use crate::keys::CHANNEL_PREFIX;

/// One call of a script in a pipeline: its KEYS and its ARGV.
pub type ScriptCall<'a> = (Vec<&'a [u8]>, Vec<&'a [u8]>);

pub struct LuaScript {
    /// Its file in `lua/`, for messages.
    file: &'static str,
    source: String,
    sha1: String,
}

impl LuaScript {
    /// `parts`: the helpers and the body, in the order Lua must see them (a local function is
    /// visible only after it).
    fn new(file: &'static str, parts: &[&str]) -> Self {
        let source = [preamble().as_str()]
            .iter()
            .chain(parts)
            .copied()
            .collect::<Vec<_>>()
            .join("\n");
        let sha1 = redis::Script::new(&source).get_hash().to_owned();
        LuaScript { file, source, sha1 }
    }

    /// One round trip: EVALSHA, then EVAL (which also caches the script) only on NOSCRIPT.
    pub fn run<T: FromRedisValue>(
        &self,
        conn: &mut impl ConnectionLike,
        keys: &[&[u8]],
        args: &[&[u8]],
    ) -> RedisResult<T> {
        let query = |conn: &mut _, verb, script| -> RedisResult<T> {
            let packed = eval(verb, script, keys, args);
            let reply = ConnectionLike::req_packed_command(conn, &packed)?;
            Ok(T::from_redis_value(reply.extract_error()?)?)
        };
        match query(conn, "EVALSHA", self.sha1.as_bytes()) {
            Err(error) if error.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                query(conn, "EVAL", self.source.as_bytes())
            }
            other => other,
        }
    }

    /// One round trip for many calls: EVALSHA of each, pipelined, then (only on NOSCRIPT) EVAL
    /// of those Redis did not know, pipelined too. Replies come back in order, error replies as
    /// `Value::ServerError`. Each reply is read on its own, as `acquire` reads its two.
    pub fn run_many(
        &self,
        conn: &mut redis::Connection,
        calls: &[ScriptCall],
    ) -> RedisResult<Vec<Value>> {
        let mut replies = self.pipelined(conn, "EVALSHA", self.sha1.as_bytes(), calls)?;
        let unknown: Vec<usize> = (0..replies.len())
            .filter(|&at| matches!(&replies[at], Value::ServerError(e) if e.code() == "NOSCRIPT"))
            .collect();
        if !unknown.is_empty() {
            let again: Vec<_> = unknown.iter().map(|&at| calls[at].clone()).collect();
            let retried = self.pipelined(conn, "EVAL", self.source.as_bytes(), &again)?;
            for (at, reply) in unknown.into_iter().zip(retried) {
                replies[at] = reply;
            }
        }
        Ok(replies)
    }

    fn pipelined(
        &self,
        conn: &mut redis::Connection,
        verb: &str,
        script: &[u8],
        calls: &[ScriptCall],
    ) -> RedisResult<Vec<Value>> {
        let mut pipeline = Vec::new();
        for (keys, args) in calls {
            pack_eval(&mut pipeline, verb, script, keys, args);
        }
        conn.send_packed_command(&pipeline)?;
        calls.iter().map(|_| conn.recv_response()).collect()
    }

    /// Writes EVAL of this script on `conn` without waiting for the reply: to undo a command
    /// cut short on the same connection, which Redis then runs first (connections are served in
    /// order; another connection's command could overtake it). EVAL, not EVALSHA: no reply
    /// comes back to tell us about NOSCRIPT.
    pub fn send_after(&self, conn: &mut redis::Connection, keys: &[&[u8]], args: &[&[u8]]) {
        let _ = conn.send_packed_command(&eval("EVAL", self.source.as_bytes(), keys, args));
    }

    #[cfg(test)]
    fn source(&self) -> &str {
        &self.source
    }

    #[cfg(test)]
    fn sha1(&self) -> &str {
        &self.sha1
    }
}

/// EVAL or EVALSHA of `script`, packed.
fn eval(verb: &str, script: &[u8], keys: &[&[u8]], args: &[&[u8]]) -> Vec<u8> {
    let mut packed = Vec::new();
    pack_eval(&mut packed, verb, script, keys, args);
    packed
}

fn pack_eval(out: &mut Vec<u8>, verb: &str, script: &[u8], keys: &[&[u8]], args: &[&[u8]]) {
    let mut digits = itoa::Buffer::new();
    let head = [
        verb.as_bytes(),
        script,
        digits.format(keys.len()).as_bytes(),
    ];
    pack(
        out,
        head.into_iter().chain(keys.iter().chain(args).copied()),
    );
}

/// Appends one command, packed as Redis reads it (an array of bulk strings), to `out`, which
/// grows once: redis-rs's `Cmd` grows two Vecs argument by argument and copies them again when
/// it packs, about 5,000 instructions of a lock cycle (bench/README.md).
fn pack<'a>(out: &mut Vec<u8>, args: impl Iterator<Item = &'a [u8]> + Clone) {
    let (count, bytes) = args
        .clone()
        .fold((0, 0), |(n, b), arg| (n + 1, b + arg.len()));
    // "$" or "*", at most 20 digits and CRLF per header, and CRLF after each argument.
    out.reserve(23 + count * 25 + bytes);
    header(out, b'*', count);
    for arg in args {
        header(out, b'$', arg.len());
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
}

fn header(out: &mut Vec<u8>, kind: u8, length: usize) {
    out.push(kind);
    out.extend_from_slice(itoa::Buffer::new().format(length).as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// Fencing tokens are at least this: a counter seeded from Redis's clock in microseconds (1e15
/// is September 2001). An INCR that returns less found the counter missing.
pub const SEEDED: u64 = 1_000_000_000_000_000;

/// What Rust gives every script: the channel prefix and the fencing counter's seed threshold.
fn preamble() -> String {
    let prefix = std::str::from_utf8(CHANNEL_PREFIX).expect("the channel prefix is ASCII");
    format!("local CHANNEL_PREFIX = '{prefix}'\nlocal FENCING_SEEDED = {SEEDED}")
}

/// The fencing counter, with what it calls.
const FENCING: &str = concat!(
    include_str!("lua/shared/int.lua"),
    include_str!("lua/shared/time.lua"),
    include_str!("lua/shared/fencing.lua"),
);
/// A unique job's claim (after `FENCING`).
const CLAIMING: &str = include_str!("lua/shared/claim.lua");
/// The queue helpers, with what they call: every script that may hand a lock on.
const QUEUE: &str = concat!(
    include_str!("lua/shared/int.lua"),
    include_str!("lua/shared/time.lua"),
    include_str!("lua/shared/fencing.lua"),
    include_str!("lua/shared/publish.lua"),
    include_str!("lua/shared/queue.lua"),
);
/// The semaphore helpers, after the queue's.
const SEMAPHORE: &str = include_str!("lua/shared/semaphore.lua");

/// Redis's clock, with what it calls: for the limiters' and the parking scripts.
const CLOCK: &str = concat!(
    include_str!("lua/shared/int.lua"),
    include_str!("lua/shared/time.lua"),
);
/// The parked jobs' helpers, after the queue's and the semaphore's (a parked job may wait for a
/// semaphore's permit).
const PARKING: &str = include_str!("lua/shared/park.lua");

/// What the uncontended acquire found.
pub enum Acquired {
    /// The token holds the lock, with this fencing token.
    Taken(u64),
    /// Another token holds it.
    Held,
    /// SET took the lock, but the counter refused to issue a fencing token (a user's ACL, a
    /// value that is not a number, OOM between the two): the caller must release the lock,
    /// then report the error.
    Unfenced(RedisError),
}

/// Takes `key` for `token` with a TTL of `ttl_ms`, and a fencing token, in one round trip of plain
/// commands: `SET key token NX PX ttl` and `INCR counter`, pipelined. The same in a Lua script
/// costs Redis 13% more CPU per lock cycle (the script call, not its commands: measured at 8
/// threads), and Redis is what bounds many threads locking at once. INCR also runs when SET finds
/// the lock taken: that only leaves a gap in the numbers. A counter found missing is seeded by
/// `SEED`. `resent`: an earlier send of this acquire may have taken the lock before its reply was
/// lost, so a lock found taken may be this token's: then its TTL is reset and it counts as taken.
pub fn acquire(
    conn: &mut redis::Connection,
    key: &[u8],
    counter: &[u8],
    token: &str,
    ttl_ms: &str,
    resent: bool,
) -> RedisResult<Acquired> {
    let mut pipeline = Vec::new();
    let set: [&[u8]; 6] = [
        b"SET",
        key,
        token.as_bytes(),
        b"NX",
        b"PX",
        ttl_ms.as_bytes(),
    ];
    pack(&mut pipeline, set.into_iter());
    pack(&mut pipeline, [b"INCR".as_slice(), counter].into_iter());
    conn.send_packed_command(&pipeline)?;
    // Each reply is read on its own, and the first failure to read ends the call: redis-rs's own
    // pipeline reading goes on to the next reply after a timeout or EINTR, which doubles the
    // timeout and swallows the signal Ruby's interrupts are delivered with. An error reply is
    // not such a failure: the next reply is read too, so the connection stays usable.
    let set = conn.recv_response()?.extract_error();
    let incr = conn.recv_response()?.extract_error();
    let taken = match set? {
        Value::Nil => {
            resent && REFRESH.run::<i64>(conn, &[key], &[token.as_bytes(), ttl_ms.as_bytes()])? == 1
        }
        _ => true,
    };
    if !taken {
        return Ok(Acquired::Held);
    }
    let issued = incr.and_then(|reply| Ok(u64::from_redis_value(reply)?));
    let seeded = match issued {
        Ok(fencing_token) if fencing_token >= SEEDED => Ok(fencing_token),
        Ok(_) => SEED.run::<u64>(conn, &[counter], &[]),
        Err(error) => Err(error),
    };
    match seeded {
        Ok(fencing_token) => Ok(Acquired::Taken(fencing_token)),
        // A reply from Redis: the connection is fine, and the lock taken is the caller's to undo.
        Err(error) if error.code().is_some() => Ok(Acquired::Unfenced(error)),
        Err(error) => Err(error),
    }
}

/// A script of `lua/`, built on first use from its helpers and its file.
macro_rules! script {
    ($name:ident, [$($helper:expr),*], $file:literal) => {
        #[doc = concat!("See `lua/", $file, "`.")]
        pub static $name: LazyLock<LuaScript> =
            LazyLock::new(|| {
                LuaScript::new($file, &[$($helper,)* include_str!(concat!("lua/", $file))])
            });
    };
}

script!(ACQUIRE, [FENCING], "acquire.lua");
script!(SEED, [FENCING], "seed.lua");
script!(WAIT, [QUEUE], "wait.lua");
script!(RELEASE, [QUEUE], "release.lua");
script!(LEAVE, [QUEUE], "leave.lua");
script!(REFRESH, [], "refresh.lua");
script!(CLAIM, [FENCING, CLAIMING], "claim.lua");
script!(CLAIM_PUSH, [FENCING, CLAIMING], "claim_push.lua");
script!(ACQUIRE_SHARED, [QUEUE, SEMAPHORE], "acquire_shared.lua");
script!(WAIT_SHARED, [QUEUE, SEMAPHORE], "wait_shared.lua");
script!(RELEASE_SHARED, [QUEUE, SEMAPHORE], "release_shared.lua");
script!(LEAVE_SHARED, [QUEUE, SEMAPHORE], "leave_shared.lua");
script!(REFRESH_SHARED, [QUEUE, SEMAPHORE], "refresh_shared.lua");
script!(
    FORCE_RELEASE,
    [QUEUE, SEMAPHORE, PARKING],
    "force_release.lua"
);
script!(LIMIT_GCRA, [CLOCK], "limit_gcra.lua");
script!(LIMIT_WINDOW, [CLOCK], "limit_window.lua");
script!(LIMIT_SLIDING, [CLOCK], "limit_sliding.lua");
script!(PARK, [QUEUE, SEMAPHORE, PARKING], "park.lua");
script!(
    RELEASE_PARKED,
    [QUEUE, SEMAPHORE, PARKING],
    "release_parked.lua"
);
script!(
    RELEASE_SHARED_PARKED,
    [QUEUE, SEMAPHORE, PARKING],
    "release_shared_parked.lua"
);
script!(UNPARK, [QUEUE, SEMAPHORE, PARKING], "unpark.lua");

/// Every script, for `refused_line` and the tests.
fn all() -> [&'static LuaScript; 21] {
    [
        &ACQUIRE,
        &CLAIM,
        &CLAIM_PUSH,
        &SEED,
        &WAIT,
        &RELEASE,
        &LEAVE,
        &REFRESH,
        &ACQUIRE_SHARED,
        &WAIT_SHARED,
        &RELEASE_SHARED,
        &LEAVE_SHARED,
        &REFRESH_SHARED,
        &FORCE_RELEASE,
        &LIMIT_GCRA,
        &LIMIT_WINDOW,
        &LIMIT_SLIDING,
        &PARK,
        &RELEASE_PARKED,
        &RELEASE_SHARED_PARKED,
        &UNPARK,
    ]
}

/// Where a script was refused by Redis's ACL: Redis 7.0 names neither the command nor the key
/// ("... script: <sha1>, on @user_script:<line>."), but the script and its line say which
/// command it was. `None` when `reply` names no script of ours.
pub fn refused_line(reply: &str) -> Option<String> {
    let (_, rest) = reply.rsplit_once("script: ")?;
    let (sha1, rest) = rest.split_once(", on @user_script:")?;
    let line: usize = rest
        .trim_end_matches('.')
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()?;
    let script = all().into_iter().find(|s| s.sha1 == sha1)?;
    let text = script.source.lines().nth(line.checked_sub(1)?)?.trim();
    Some(format!("{text} ({}, line {line})", script.file))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_packed_as_redis_rs_packs_them() {
        let (key, args): (&[u8], [&[u8]; 3]) = (b"k", [b"", b"\r\n", &[0xff; 300]]);
        let expected = redis::cmd("EVALSHA")
            .arg("sha")
            .arg(1)
            .arg(key)
            .arg(&args[..])
            .get_packed_command();
        assert_eq!(eval("EVALSHA", b"sha", &[key], &args), expected);
        let mut pipeline = Vec::new();
        pack(&mut pipeline, [b"SET".as_slice(), key, b"t"].into_iter());
        pack(&mut pipeline, [b"INCR".as_slice(), b"c"].into_iter());
        let expected = redis::pipe()
            .cmd("SET")
            .arg(key)
            .arg("t")
            .cmd("INCR")
            .arg("c")
            .get_packed_pipeline();
        assert_eq!(pipeline, expected);
    }

    #[test]
    fn no_script_writes_a_channel_or_key_name_of_its_own() {
        for script in all() {
            let body = script.source().split_once('\n').unwrap().1;
            let body = body.split_once('\n').unwrap().1; // after the preamble
            assert!(!body.contains("lock_manager:"), "{body}");
            assert!(!body.contains("1000000000000000"), "{body}");
        }
    }

    #[test]
    fn every_helper_a_script_calls_is_defined_before_its_first_call() {
        let helpers = [
            "int",
            "now_us",
            "now_ms",
            "next_fencing_token",
            "publish",
            "live_waiter",
            "dequeue",
            "live_head",
            "live_ahead",
            "join_queue",
            "tell_new_holder",
            "release_lock",
            "admit",
            "holders",
            "holds",
            "first_expiry",
            "hand_permit",
            "claim",
            "parked_entry",
            "arm_fallback",
            "unpark_head",
        ];
        for script in all() {
            let source = script.source();
            for helper in helpers {
                let Some(first) = source.find(&format!("{helper}(")) else {
                    continue;
                };
                let definition = format!("local function {helper}(");
                let defined = source
                    .find(&definition)
                    .map(|at| at + "local function ".len());
                assert_eq!(
                    defined,
                    Some(first),
                    "{helper} used before its definition in:\n{source}"
                );
            }
        }
    }

    #[test]
    fn a_refused_line_is_found_by_the_scripts_sha1() {
        let line = ACQUIRE
            .source()
            .lines()
            .position(|l| l.contains("redis.call("))
            .unwrap()
            + 1;
        let reply = format!(
            "ERR The user executing the script can't run this command or subcommand script: {}, \
             on @user_script:{line}.",
            ACQUIRE.sha1()
        );
        let found = refused_line(&reply).unwrap();
        assert!(
            found.contains("redis.call(")
                && found.ends_with(&format!("(acquire.lua, line {line})"))
        );
        assert_eq!(refused_line("NOPERM this user has no permissions"), None);
        assert_eq!(refused_line("script: 0000, on @user_script:1."), None);
    }

    #[test]
    fn scripts_are_distinct() {
        let mut hashes: Vec<&str> = all().iter().map(|s| s.sha1.as_str()).collect();
        hashes.sort();
        hashes.dedup();
        assert_eq!(hashes.len(), all().len());
    }
}
