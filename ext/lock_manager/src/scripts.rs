//! Every Lua script the gem sends to Redis, the EVALSHA-then-EVAL call that runs them, and the
//! one acquire that needs no script (`acquire`: SET NX PX and INCR, pipelined).
//!
//! Keys and values reach Lua only through KEYS and ARGV, never by string building. A plain
//! lock uses three keys: KEYS[1] the lock (a string holding the owner's token), KEYS[2] the
//! queue of waiters (a sorted set: token -> arrival in microseconds) and KEYS[3] the waiters'
//! details (a hash: token -> "heartbeat deadline ms:lock ttl ms:channel"). A release that hands
//! the lock on tells the new owner "<its token> <its fencing token>" ("-" for a fencing token the
//! counter refused): on the channel its process listens on alone, with " <lock key>" after it,
//! or, for a waiter that gave no channel, on the lock's channel "lock_manager:" .. KEYS[1], which
//! every waiting process listens on. An empty message there means "look again, all of you".
//! Every script that grants the lock also issues a fencing token from the counter it is given
//! as its last key (see `fencing`).

use std::sync::LazyLock;

use redis::{
    Cmd, ConnectionLike, ErrorKind, FromRedisValue, RedisError, RedisResult, ServerErrorKind, Value,
};

/// The prefix of the channel a lock's releases are published on; the lock key follows it.
pub const CHANNEL_PREFIX: &[u8] = b"lock_manager:";

pub struct LuaScript {
    source: String,
    sha1: String,
}

impl LuaScript {
    fn new(source: String) -> Self {
        let sha1 = redis::Script::new(&source).get_hash().to_owned();
        LuaScript { source, sha1 }
    }

    /// One round trip: EVALSHA, then EVAL (which also caches the script) only on NOSCRIPT.
    pub fn run<T: FromRedisValue>(
        &self,
        conn: &mut impl ConnectionLike,
        keys: &[&[u8]],
        args: &[&[u8]],
    ) -> RedisResult<T> {
        match eval("EVALSHA", self.sha1.as_bytes(), keys, args).query(conn) {
            Err(error) if error.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                eval("EVAL", self.source.as_bytes(), keys, args).query(conn)
            }
            other => other,
        }
    }
}

impl LuaScript {
    /// Writes EVAL of this script on `conn` without waiting for the reply: to undo a command
    /// cut short on the same connection, which Redis then runs first (connections are served in
    /// order; another connection's command could overtake it). EVAL, not EVALSHA: no reply
    /// comes back to tell us about NOSCRIPT.
    pub fn send_after(&self, conn: &mut redis::Connection, keys: &[&[u8]], args: &[&[u8]]) {
        let _ = conn.send_packed_command(
            &eval("EVAL", self.source.as_bytes(), keys, args).get_packed_command(),
        );
    }
}

fn eval(verb: &str, script: &[u8], keys: &[&[u8]], args: &[&[u8]]) -> Cmd {
    let mut cmd = redis::cmd(verb);
    cmd.arg(script).arg(keys.len());
    for item in keys.iter().chain(args) {
        cmd.arg(*item);
    }
    cmd
}

/// Fencing tokens are at least this: a counter seeded from Redis's clock in microseconds (1e15
/// is September 2001). An INCR that returns less found the counter missing.
pub const SEEDED: u64 = 1_000_000_000_000_000;

/// Issues the next fencing token from the counter KEYS[#KEYS]: one counter per key prefix,
/// so the number only grows for every key (with gaps) and no per-key counter outlives its lock.
/// A counter that is missing (first use, or Redis restarted without persistence) starts at
/// Redis's clock in microseconds, which is above any number issued before it, since no Redis
/// grants a million locks a second: a holder from before the restart is still fenced off.
/// (Lua numbers are doubles: exact up to 2^53, about year 2255 in microseconds.)
fn fencing() -> String {
    format!(
        r"
local function next_fencing_token()
  local counter = KEYS[#KEYS]
  local token = redis.call('INCR', counter)
  if token < {SEEDED} then
    local time = redis.call('TIME')
    local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
    if now > token then
      token = now
      redis.call('SET', counter, string.format('%d', token))
    end
  end
  return token
end
"
    )
}

/// Helpers shared by the plain-lock scripts below.
const QUEUE_HELPERS: &str = r"
local function now_ms()
  local time = redis.call('TIME')
  return tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
end

-- The first queued waiter whose heartbeat is still running, the TTL it asked for and the channel
-- its process listens on ('' for none); waiters whose process stopped renewing their heartbeat
-- are dropped on the way.
local function live_head()
  local now
  while true do
    local head = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
    if not head then return nil end
    now = now or now_ms()
    local entry = redis.call('HGET', KEYS[3], head)
    if entry then
      local deadline, ttl, channel = string.match(entry, '^(%d+):(%d+):(.*)$')
      if deadline and tonumber(deadline) > now then return head, tonumber(ttl), channel end
    end
    redis.call('ZREM', KEYS[2], head)
    redis.call('HDEL', KEYS[3], head)
  end
end

local function dequeue(token)
  redis.call('ZREM', KEYS[2], token)
  redis.call('HDEL', KEYS[3], token)
end

-- Tells waiting processes, on `channel` or else the lock's own; a user whose ACL forbids the
-- channel only loses the wake-up (its waiters fall back to their backoff), never the release.
local function publish(message, channel)
  redis.pcall('PUBLISH', channel or ('lock_manager:' .. KEYS[1]), message)
end

-- Hands the lock to the first live waiter, for at most `handoff_ms` (a waiter that died before
-- noticing cannot hold the line for long: it extends the lock to its TTL while it holds it), with
-- its fencing token, and tells it both: the message is all it needs to go ahead. It goes to the
-- waiter's own process when it gave a channel, so no other process wakes for it. With nobody
-- queued, deletes the lock (every blocking waiter is queued: no one to tell).
-- DEL comes first: under maxmemory Redis refuses a script whose first write may grow memory
-- (the hand-off's SET), not one that already freed some. A counter that refuses a token (not a
-- number) leaves the waiter to confirm with its own attempt, which reports the refusal.
-- Returns the message, or nil when the lock was freed.
local function release_lock(handoff_ms)
  redis.call('DEL', KEYS[1])
  local head, ttl, channel = live_head()
  if head then
    redis.call('SET', KEYS[1], head, 'PX', math.min(ttl, handoff_ms))
    dequeue(head)
    local issued, fencing_token = pcall(next_fencing_token)
    local message = head .. ' ' .. (issued and string.format('%d', fencing_token) or '-')
    if channel == '' then
      publish(message)
    else
      publish(message .. ' ' .. KEYS[1], channel)
    end
    return message
  end
end
";

fn with_helpers(body: &str) -> LuaScript {
    LuaScript::new(format!("{}\n{QUEUE_HELPERS}\n{body}", fencing()))
}

fn with_fencing(body: &str) -> LuaScript {
    LuaScript::new(format!("{}\n{body}", fencing()))
}

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
    let pipeline = redis::pipe()
        .cmd("SET")
        .arg(key)
        .arg(token)
        .arg("NX")
        .arg("PX")
        .arg(ttl_ms)
        .cmd("INCR")
        .arg(counter)
        .get_packed_pipeline();
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

/// The same as `acquire`, as one script: what a Locker uses until a script has run on its pool,
/// so that a Redis user who may not run scripts, and so could never release, is refused before it
/// takes anything. KEYS[1]: the lock, KEYS[2]: the fencing counter; ARGV: token, TTL ms. Returns
/// the fencing token, or 0 when held by another. The token is issued first: a counter that is
/// refused (ACL, not a number, OOM) fails the script before it writes the lock.
pub static ACQUIRE: LazyLock<LuaScript> = LazyLock::new(|| {
    with_fencing(
        r"
local fencing_token = next_fencing_token()
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return fencing_token end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return fencing_token
end
return 0
",
    )
});

/// Issues a fencing token from the counter KEYS[1] when `acquire`'s INCR found it missing.
pub static SEED: LazyLock<LuaScript> =
    LazyLock::new(|| with_fencing("return next_fencing_token()"));

/// A waiter's attempt. ARGV: token, lock TTL ms, heartbeat ms, the channel its process listens
/// on for hand-offs to it ('' for the lock's channel); KEYS[4]: the fencing counter.
/// Takes the lock when it was handed to this token, or when it is free and no live waiter queued
/// earlier; otherwise joins the queue (or renews its place). Returns {1, fencing token} when
/// held, else {0, the lock's PTTL} (-2: free, another waiter's turn).
pub static WAIT: LazyLock<LuaScript> = LazyLock::new(|| {
    with_helpers(
        r"
local token, ttl = ARGV[1], tonumber(ARGV[2])
local current = redis.call('GET', KEYS[1])
if current == token then
  redis.call('PEXPIRE', KEYS[1], ttl)
  dequeue(token)
  return {1, next_fencing_token()}
end
if not current then
  local head = live_head()
  if not head or head == token then
    redis.call('SET', KEYS[1], token, 'PX', ttl)
    dequeue(token)
    return {1, next_fencing_token()}
  end
end
local heartbeat = tonumber(ARGV[3])
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
redis.call('ZADD', KEYS[2], 'NX', tonumber(time[1]) * 1000000 + tonumber(time[2]), token)
redis.call('HSET', KEYS[3], token, (now + heartbeat) .. ':' .. ttl .. ':' .. ARGV[4])
redis.call('PEXPIRE', KEYS[2], heartbeat * 2)
redis.call('PEXPIRE', KEYS[3], heartbeat * 2)
return {0, redis.call('PTTL', KEYS[1])}
",
    )
});

/// Releases the lock only while ARGV[1] (token) holds it, handing it to the next live waiter
/// (for at most ARGV[2] ms until it extends it). Never touches another holder's lock. KEYS[4]:
/// the fencing counter, for the waiter handed the lock. Returns 0 when ARGV[1] did not hold it,
/// 1 when it is freed, or the hand-off message when handed over: the releasing process tells
/// its own waiter at once, ahead of the publication.
pub static RELEASE: LazyLock<LuaScript> = LazyLock::new(|| {
    with_helpers(
        r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
return release_lock(tonumber(ARGV[2])) or 1
",
    )
});

/// A waiter gives up (deadline, interrupt): leaves the queue, passes on a lock handed to it
/// meanwhile, and wakes the others when the lock is free. ARGV: token, hand-off ms; KEYS[4]:
/// the fencing counter.
pub static LEAVE: LazyLock<LuaScript> = LazyLock::new(|| {
    with_helpers(
        r"
dequeue(ARGV[1])
local current = redis.call('GET', KEYS[1])
if current == ARGV[1] then
  release_lock(tonumber(ARGV[2]))
elseif not current and redis.call('EXISTS', KEYS[2]) == 1 then
  publish('')
end
return 0
",
    )
});

/// Resets the TTL to ARGV[2] ms only while ARGV[1] (token) still holds the lock.
pub static REFRESH: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::new(
        r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"
        .to_owned(),
    )
});

/// Admits ARGV[1] (token) as one of at most ARGV[3] holders of the semaphore KEYS[1] for
/// ARGV[2] ms. Holders are members of a sorted set scored by their expiry in Redis time, so an
/// expired holder frees its slot without touching the others; a token already admitted is
/// renewed (a re-sent acquire must not fail because of itself). The key itself expires with its
/// last holder. KEYS[2]: the fencing counter. Returns {1, fencing token}, or {0, ms until the
/// first holder expires}. Its first write is the ZADD, which Redis refuses under maxmemory.
pub static ACQUIRE_SHARED: LazyLock<LuaScript> = LazyLock::new(|| {
    with_fencing(
        r"
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local mine = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[1]) or '0')
if mine > now or redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf') < tonumber(ARGV[3]) then
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  redis.call('PEXPIREAT', KEYS[1], last[2])
  return {1, next_fencing_token()}
end
local first = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
return {0, tonumber(first[2]) - now}
",
    )
});

/// Extends ARGV[1]'s slot of the semaphore KEYS[1] to ARGV[2] ms from now, only while it has
/// not expired. Returns 1, or 0 when the slot is gone.
pub static REFRESH_SHARED: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::new(
        r"
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local expiry = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not expiry or tonumber(expiry) <= now then return 0 end
redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[2]), ARGV[1])
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
redis.call('PEXPIREAT', KEYS[1], last[2])
return 1
"
        .to_owned(),
    )
});

/// Frees ARGV[1]'s slot of the semaphore KEYS[1], and tells waiting processes.
pub static RELEASE_SHARED: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::new(
        r"
local removed = redis.call('ZREM', KEYS[1], ARGV[1])
if removed == 1 then redis.pcall('PUBLISH', 'lock_manager:' .. KEYS[1], '') end
return removed
"
        .to_owned(),
    )
});
