//! Claims: locks taken for a token the caller names (a job's id), many in one round trip, and
//! left in Redis for whichever process runs the job to release: the enqueue locks of unique jobs.
//! A claim's holder is its token, so a refused claim says who holds the lock at no extra cost.

use redis::{FromRedisValue, Value};

use crate::error::LockError;
use crate::gvl::Interrupt;
use crate::keys::KeySpace;
use crate::lock_core::LockCore;
use crate::replies::FencingToken;
use crate::scripts::{ScriptCall, CLAIM, RELEASE};
use crate::wait::HEARTBEAT_MS;

/// What one claim found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claimed {
    /// The token holds the lock now (taken, or held by it already: its TTL was reset).
    Taken(FencingToken),
    /// Another token holds it.
    HeldBy(Vec<u8>),
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
        let locks: Vec<Vec<u8>> = claims.iter().map(|c| self.redis_key(c.key)).collect();
        let counters: Vec<Vec<u8>> = locks.iter().map(|l| KeySpace::fencing_counter(l)).collect();
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

fn claimed(reply: Value) -> Result<Claimed, redis::RedisError> {
    match reply.extract_error()? {
        Value::Int(fencing_token) => Ok(Claimed::Taken(fencing_token as FencingToken)),
        holder => Ok(Claimed::HeldBy(Vec::<u8>::from_redis_value(holder)?)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::Value;

    #[test]
    fn a_number_is_a_fencing_token_and_a_string_the_holder() {
        assert_eq!(claimed(Value::Int(7)).unwrap(), Claimed::Taken(7));
        let holder = Value::BulkString(b"jid-1".to_vec());
        assert_eq!(claimed(holder).unwrap(), Claimed::HeldBy(b"jid-1".to_vec()));
    }
}
