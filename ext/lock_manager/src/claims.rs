//! Claims: locks taken for a token the caller names (a job's id), many in one round trip, and
//! left in Redis for whichever process runs the job to release: the enqueue locks of unique jobs.
//! A claim's holder is its token, so a refused claim says who holds the lock at no extra cost.

use redis::{FromRedisValue, Value};

use crate::error::LockError;
use crate::gvl::Interrupt;
use crate::keys::KeySpace;
use crate::lock_core::LockCore;
use crate::replies::FencingToken;
use crate::scripts::{ScriptCall, CLAIM, CLAIM_PUSH, RELEASE};
use crate::wait::HEARTBEAT_MS;

/// What one claim found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claimed {
    /// The token holds the lock now (taken, or held by it already: its TTL was reset).
    Taken(FencingToken),
    /// Another token holds it.
    HeldBy(Vec<u8>),
    /// The token holds it now, taken from this token's job, which was pending: that job's push was
    /// taken out of its queue (`claim_and_push` with `replacing`).
    Replaced(FencingToken, Vec<u8>),
}

/// One claim: a key (without the prefix), the token to hold it, its TTL.
pub struct ClaimRequest<'a> {
    pub key: &'a [u8],
    pub token: &'a str,
    pub ttl_ms: u64,
}

impl LockCore {
    /// Takes each key for its token unless another token holds it. On one Redis, every claim
    /// goes in one round trip; on a Cluster, one round trip per claim (its node's). Claims cut
    /// short (interrupt, timeout) are undone on the same connection: a job that was never pushed
    /// leaves no lock.
    pub fn claim_all(
        &self,
        claims: &[ClaimRequest],
        interrupt: &Interrupt,
    ) -> Result<Vec<Claimed>, LockError> {
        if self.pool().is_cluster() {
            return claims
                .iter()
                .map(|claim| {
                    Ok(self
                        .claim_batch(std::slice::from_ref(claim), interrupt)?
                        .remove(0))
                })
                .collect();
        }
        self.claim_batch(claims, interrupt)
    }

    /// Claims that all live on one node, in one round trip.
    fn claim_batch(
        &self,
        claims: &[ClaimRequest],
        interrupt: &Interrupt,
    ) -> Result<Vec<Claimed>, LockError> {
        let Some(first) = claims.first() else {
            return Ok(Vec::new());
        };
        let (locks, counters) = self.claim_keys(claims);
        let ttls: Vec<String> = claims.iter().map(|c| c.ttl_ms.to_string()).collect();
        let calls: Vec<ScriptCall> = (0..claims.len())
            .map(|at| {
                let keys: Vec<&[u8]> = vec![&locks[at], &counters[at]];
                (keys, vec![claims[at].token.as_bytes(), ttls[at].as_bytes()])
            })
            .collect();
        let undo = |conn: &mut redis::Connection| {
            for claim in claims {
                let keys = self.keys().lock_keys(claim.key);
                let args: [&[u8]; 2] = [claim.token.as_bytes(), HEARTBEAT_MS.as_bytes()];
                RELEASE.send_after(conn, &keys.all(), &args);
            }
        };
        // Safe to send again: a claim its token holds already is taken again.
        let route = self.redis_key(first.key);
        self.pool()
            .round_trip(&route, interrupt, Some(&undo), |conn, _| {
                CLAIM
                    .run_many(conn, &calls)?
                    .into_iter()
                    .map(claimed)
                    .collect()
            })
    }

    /// Claims each key as `claim_all` does and, only where the claim is taken, runs its push (a
    /// job's own push commands, each `[name, key, args...]`): a job is pushed with its lock or not
    /// at all, every claim and push in one script, one round trip. For a Redis that is also the
    /// jobs' Redis (never a Cluster: the push's keys lie in other slots). Nothing is undone: the
    /// script runs whole or not at all. A send is repeated only on a connection found dead before
    /// its reply; where that send may have run (its token holds the lock), nothing is pushed again
    /// and the round trip fails as a lost connection.
    pub fn claim_and_push(
        &self,
        claims: &[ClaimRequest],
        pushes: &[Vec<Vec<Vec<u8>>>],
        replacing: &[bool],
        interrupt: &Interrupt,
    ) -> Result<Vec<Claimed>, LockError> {
        let Some(first) = claims.first() else {
            return Ok(Vec::new());
        };
        let (locks, counters) = self.claim_keys(claims);
        let replaces = |at: usize| replacing.get(at).copied().unwrap_or(false);
        // Where a replacing job's push is remembered: for those jobs alone.
        let pending: Vec<Vec<u8>> = (0..claims.len())
            .map(|at| {
                if replaces(at) {
                    self.keys().pending(claims[at].key)
                } else {
                    Vec::new()
                }
            })
            .collect();
        // The numbers the script reads, as text that outlives the arguments pointing into it.
        let ttls: Vec<String> = claims.iter().map(|c| c.ttl_ms.to_string()).collect();
        let command_counts: Vec<String> = pushes.iter().map(|p| p.len().to_string()).collect();
        let argument_counts: Vec<Vec<String>> = pushes
            .iter()
            .map(|push| push.iter().map(|c| (c.len() - 2).to_string()).collect())
            .collect();
        let mut keys: Vec<&[u8]> = Vec::new();
        let mut args: Vec<&[u8]> = vec![b"0"];
        for at in 0..claims.len() {
            let replaces = replaces(at);
            keys.push(&locks[at]);
            if replaces {
                keys.push(&pending[at]);
            }
            args.extend([
                claims[at].token.as_bytes(),
                ttls[at].as_bytes(),
                command_counts[at].as_bytes(),
                if replaces { b"1" } else { b"0" },
            ]);
            for (command, count) in pushes[at].iter().zip(&argument_counts[at]) {
                keys.push(&command[1]);
                args.extend([command[0].as_slice(), count.as_bytes()]);
                args.extend(command[2..].iter().map(Vec::as_slice));
            }
            keys.push(&counters[at]);
        }
        let route = self.redis_key(first.key);
        let replies = self
            .pool()
            .round_trip(&route, interrupt, None, |conn, sent| {
                args[0] = if sent.resent { b"1" } else { b"0" };
                match CLAIM_PUSH.run::<Value>(conn, &keys, &args)? {
                    Value::Array(replies) => replies
                        .into_iter()
                        .map(|reply| match reply {
                            Value::Nil | Value::Boolean(false) => Ok(None),
                            reply => claimed(reply).map(Some),
                        })
                        .collect::<Result<Vec<_>, _>>(),
                    other => Err(unexpected(other)),
                }
            })?;
        if replies.iter().any(Option::is_none) {
            let addr = self.pool().pool_for(&route)?.addr();
            return Err(LockError::connection(
                &addr,
                "the connection dropped after a job's push was sent, and the push was not sent again: \
                 the job may be in its queue, with its lock",
            ));
        }
        Ok(replies.into_iter().flatten().collect())
    }

    /// Each claim's lock key and its fencing counter's, in Redis.
    fn claim_keys(&self, claims: &[ClaimRequest]) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
        let locks: Vec<Vec<u8>> = claims.iter().map(|c| self.redis_key(c.key)).collect();
        let counters = locks.iter().map(|l| KeySpace::fencing_counter(l)).collect();
        (locks, counters)
    }

    /// The Redis the locks live on, as "run_id/db" (its `INFO server` run_id and this
    /// connection's database): the jobs' Redis when its connections say the same, and then a
    /// claim may carry its job's push (`claim_and_push`). None on a Cluster, or a Redis older
    /// than 6.2 (no CLIENT INFO).
    pub fn server_identity(&self, interrupt: &Interrupt) -> Result<Option<String>, LockError> {
        if self.pool().is_cluster() {
            return Ok(None);
        }
        let route = self.redis_key(b"");
        self.pool().round_trip(&route, interrupt, None, |conn, _| {
            let replies: (Value, Value) = redis::pipe()
                .cmd("INFO")
                .arg("server")
                .cmd("CLIENT")
                .arg("INFO")
                .query(conn)?;
            match replies {
                (Value::BulkString(info), Value::BulkString(client)) => Ok(identity(
                    &String::from_utf8_lossy(&info),
                    &String::from_utf8_lossy(&client),
                )),
                _ => Ok(None),
            }
        })
    }

    /// The token that holds `key` now, if any (none for a `limit: N` semaphore, which has N).
    pub fn holder(&self, key: &[u8], interrupt: &Interrupt) -> Result<Option<Vec<u8>>, LockError> {
        let redis_key = self.redis_key(key);
        self.pool()
            .round_trip(&redis_key, interrupt, None, |conn, _| {
                match redis::cmd("GET").arg(&redis_key).query(conn) {
                    // A `limit: N` semaphore: N holders, none of them "the" holder.
                    Err(error) if error.code() == Some("WRONGTYPE") => Ok(None),
                    reply => reply,
                }
            })
    }
}

/// "run_id/db" from `INFO server` and `CLIENT INFO`.
fn identity(info: &str, client: &str) -> Option<String> {
    let run_id = info.lines().find_map(|line| line.strip_prefix("run_id:"))?;
    let db = client
        .split_whitespace()
        .find_map(|field| field.strip_prefix("db="))?;
    Some(format!("{}/{db}", run_id.trim()))
}

fn unexpected(reply: Value) -> redis::RedisError {
    let message = format!("{reply:?}");
    (
        redis::ErrorKind::Parse,
        "claim_push.lua's reply is not an array",
        message,
    )
        .into()
}

fn claimed(reply: Value) -> Result<Claimed, redis::RedisError> {
    match reply.extract_error()? {
        Value::Int(fencing_token) => Ok(Claimed::Taken(fencing_token as FencingToken)),
        Value::Array(replaced) => match replaced.as_slice() {
            [Value::Int(fencing_token), holder] => Ok(Claimed::Replaced(
                *fencing_token as FencingToken,
                Vec::<u8>::from_redis_value(holder.clone())?,
            )),
            _ => Err((
                redis::ErrorKind::Parse,
                "a replacing claim's reply is not {fencing token, token}",
            )
                .into()),
        },
        holder => Ok(Claimed::HeldBy(Vec::<u8>::from_redis_value(holder)?)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::Value;

    #[test]
    fn a_server_is_its_run_id_and_the_connection_s_database() {
        let info = "# Server\r\nredis_version:7.0.15\r\nrun_id:abc123\r\ntcp_port:6379\r\n";
        let client = "id=5 addr=127.0.0.1:50000 laddr=127.0.0.1:6379 fd=8 name= db=3 sub=0\n";
        assert_eq!(identity(info, client), Some("abc123/3".to_owned()));
        assert_eq!(identity("redis_version:5.0.0\r\n", client), None);
    }

    #[test]
    fn a_number_is_a_fencing_token_and_a_string_the_holder() {
        assert_eq!(claimed(Value::Int(7)).unwrap(), Claimed::Taken(7));
        let holder = Value::BulkString(b"jid-1".to_vec());
        assert_eq!(
            claimed(holder.clone()).unwrap(),
            Claimed::HeldBy(b"jid-1".to_vec())
        );
        let replaced = Value::Array(vec![Value::Int(8), holder]);
        assert_eq!(
            claimed(replaced).unwrap(),
            Claimed::Replaced(8, b"jid-1".to_vec())
        );
    }
}
