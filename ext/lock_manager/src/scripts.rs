//! Every Lua script the gem sends to Redis, and the EVALSHA-then-EVAL call that runs them.
//!
//! Keys and values reach Lua only through KEYS and ARGV, never by string building.

use std::sync::LazyLock;

use redis::{Cmd, ConnectionLike, ErrorKind, FromRedisValue, RedisResult, ServerErrorKind};

pub struct LuaScript {
    source: &'static str,
    sha1: String,
}

impl LuaScript {
    fn new(source: &'static str) -> Self {
        LuaScript {
            source,
            sha1: redis::Script::new(source).get_hash().to_owned(),
        }
    }

    /// One round trip: EVALSHA, then EVAL (which also caches the script) only on NOSCRIPT.
    pub fn run<T: FromRedisValue>(
        &self,
        conn: &mut impl ConnectionLike,
        key: &[u8],
        args: &[&[u8]],
    ) -> RedisResult<T> {
        match eval("EVALSHA", self.sha1.as_bytes(), key, args).query(conn) {
            Err(error) if error.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                eval("EVAL", self.source.as_bytes(), key, args).query(conn)
            }
            other => other,
        }
    }
}

fn eval(verb: &str, script: &[u8], key: &[u8], args: &[&[u8]]) -> Cmd {
    let mut cmd = redis::cmd(verb);
    cmd.arg(script).arg(1).arg(key);
    for arg in args {
        cmd.arg(*arg);
    }
    cmd
}

/// Takes the lock for ARGV[1] (token) with a TTL of ARGV[2] ms, or renews it when that token
/// already holds it: re-sending an acquire after a lost reply must not fail because of itself.
pub static ACQUIRE: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::new(
        r"
local current = redis.call('GET', KEYS[1])
if current == false then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
elseif current == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
",
    )
});

/// Deletes the lock only while ARGV[1] (token) still holds it: never another holder's lock.
pub static RELEASE: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::new(
        r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
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
",
    )
});

/// Admits ARGV[1] (token) as one of at most ARGV[3] holders of the semaphore KEYS[1] for
/// ARGV[2] ms. Holders are members of a sorted set scored by their expiry in Redis time, so an
/// expired holder frees its slot without touching the others; a token already admitted is
/// renewed (a re-sent acquire must not fail because of itself). The key itself expires with its
/// last holder.
pub static ACQUIRE_SHARED: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::new(
        r"
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZSCORE', KEYS[1], ARGV[1]) or redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[3]) then
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
  local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  redis.call('PEXPIREAT', KEYS[1], last[2])
  return 1
end
return 0
",
    )
});
