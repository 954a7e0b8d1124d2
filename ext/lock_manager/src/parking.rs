//! Parked jobs: a job that finds its lock held (every permit of a `limit: N` semaphore taken)
//! waits in Redis, in a line beside the lock, and a release hands the lock (a permit) to the first
//! of them and pushes it to its queue, in the release's own round trip (`lua/shared/park.lua`). A fallback in Sidekiq's schedule moves the line when no
//! release comes. For a Redis that is also the jobs' (never a Cluster: a push's keys lie in other
//! slots), as the claim in the push is.

use redis::{FromRedisValue, Value};

use crate::error::{LockError, Written};
use crate::gvl::Interrupt;
use crate::lock_core::LockCore;
use crate::scripts::{PARK, RELEASE_PARKED, RELEASE_SHARED_PARKED, UNPARK};
use crate::wait::HEARTBEAT_MS;

/// A job to park on a lock.
pub struct ParkRequest<'a> {
    /// The lock, without the key prefix.
    pub key: &'a [u8],
    /// The job's own token (its id): the lock is handed over to it.
    pub token: &'a str,
    /// How long the lock lives when handed over, until the job takes it over.
    pub ttl_ms: u64,
    /// How long past the lock's expiry the fallback waits for a release.
    pub grace_ms: u64,
    /// How many jobs may be parked on the lock at most (0: no limit).
    pub most: u32,
    /// The lock's limit: 1 for a plain lock, N for a semaphore the job waits for a permit of.
    pub limit: u32,
    /// Sidekiq's schedule, and the fallback's member there.
    pub schedule: &'a [u8],
    pub fallback: &'a [u8],
    /// The job's push: Sidekiq's own commands, each `[name, key, args...]`.
    pub push: &'a [Vec<Vec<u8>>],
}

/// What parking a job did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parked {
    /// In line, at this place (1: next).
    InLine(u64),
    /// Not parked: this many are, as many as allowed.
    Full(u64),
    /// The lock was free: it went to the first parked job at once, which was pushed.
    HandedNow,
}

impl LockCore {
    /// Parks a job on its lock (one round trip). With `min_replicas`, a job parked on fewer
    /// replicas is taken out of the line again and the call fails: a failover could lose it.
    pub fn park(&self, job: &ParkRequest, interrupt: &Interrupt) -> Result<Parked, LockError> {
        self.one_redis("parking a job")?;
        let lock = self.redis_key(job.key);
        let parked = self.keys().parked(job.key);
        let numbers = [job.ttl_ms, job.grace_ms, u64::from(job.most)].map(|n| n.to_string());
        let limit = job.limit.to_string();
        let counts: Vec<String> = job.push.iter().map(|c| (c.len() - 2).to_string()).collect();
        let commands = job.push.len().to_string();
        let mut keys: Vec<&[u8]> = vec![&lock, &parked, job.schedule];
        let mut args: Vec<&[u8]> = vec![b"0", job.token.as_bytes()];
        args.extend(numbers.iter().map(String::as_bytes));
        args.extend([job.fallback, limit.as_bytes(), commands.as_bytes()]);
        for (command, count) in job.push.iter().zip(&counts) {
            keys.push(&command[1]);
            args.extend([command[0].as_slice(), count.as_bytes()]);
            args.extend(command[2..].iter().map(Vec::as_slice));
        }
        let (outcome, acknowledged) =
            self.pool()
                .round_trip(&lock, interrupt, None, |conn, sent| {
                    args[0] = if sent.resent { b"1" } else { b"0" };
                    let outcome = parked_reply(PARK.run(conn, &keys, &args)?)?;
                    let wrote = !matches!(outcome, Parked::Full(_));
                    Ok((outcome, self.acknowledged_if(wrote, conn)?))
                })?;
        let unreplicated = |error| match error {
            LockError::NotReplicated {
                write: _,
                addr,
                needed,
                reached,
                timeout,
            } => LockError::NotReplicated {
                write: Written::ParkedJob,
                addr,
                needed,
                reached,
                timeout,
            },
            other => other,
        };
        self.undone_unless_replicated(&lock, acknowledged, |undo| {
            // Still in line: taken out. Handed over already: it is in its queue, as any push.
            let _ = self.pool().round_trip(&lock, undo, None, |conn, _| {
                redis::cmd("LREM")
                    .arg(&parked)
                    .arg(1)
                    .arg(parked_entry_of(conn, &parked, job.token)?)
                    .query::<i64>(conn)
            });
        })
        .map_err(unreplicated)?;
        Ok(outcome)
    }

    /// Releases the lock (the permit, for `limit` > 1) if `token` holds it, as `release` does, but
    /// hands what no waiter is queued for to the first job parked on it, pushing that job to its
    /// queue.
    pub fn release_parked(
        &self,
        key: &[u8],
        token: &str,
        limit: u32,
        interrupt: &Interrupt,
    ) -> Result<bool, LockError> {
        let keys = self.keys().lock_keys(key);
        let parked = self.keys().parked(key);
        let all = keys.all();
        let script_keys: [&[u8]; 5] = [all[0], all[1], all[2], all[3], &parked];
        let limit = limit.to_string();
        let args: [&[u8]; 3] = [token.as_bytes(), HEARTBEAT_MS.as_bytes(), limit.as_bytes()];
        let (script, args) = if limit == "1" {
            (&*RELEASE_PARKED, &args[..2])
        } else {
            (&*RELEASE_SHARED_PARKED, &args[..])
        };
        self.pool()
            .round_trip(&keys.lock, interrupt, None, |conn, _| {
                match script.run::<Value>(conn, &script_keys, args)? {
                    Value::Int(released) => Ok(released == 1),
                    handed => {
                        let message = Vec::<u8>::from_redis_value(handed)?;
                        self.handed_over_here(&keys.lock, &message);
                        Ok(true)
                    }
                }
            })
    }

    /// The fallback of `key`'s parked jobs: a lock with room goes to the first of them. Returns
    /// the token it went to, if any.
    pub fn unpark(&self, key: &[u8], interrupt: &Interrupt) -> Result<Option<Vec<u8>>, LockError> {
        self.one_redis("unparking a job")?;
        let lock = self.redis_key(key);
        let parked = self.keys().parked(key);
        self.pool().round_trip(&lock, interrupt, None, |conn, _| {
            match UNPARK.run::<Value>(conn, &[&lock, &parked], &[])? {
                Value::BulkString(token) => Ok(Some(token)),
                _ => Ok(None),
            }
        })
    }

    /// The entries of the jobs parked on `key`, first in line first, `limit` at most (JSON
    /// arrays: see `lua/shared/park.lua`).
    pub fn parked_entries(
        &self,
        key: &[u8],
        limit: usize,
        interrupt: &Interrupt,
    ) -> Result<Vec<Vec<u8>>, LockError> {
        let lock = self.redis_key(key);
        let parked = self.keys().parked(key);
        let last = i64::try_from(limit).unwrap_or(i64::MAX) - 1;
        self.pool().round_trip(&lock, interrupt, None, |conn, _| {
            redis::cmd("LRANGE")
                .arg(&parked)
                .arg(0)
                .arg(last)
                .query(conn)
        })
    }

    /// Takes the job `token` out of `key`'s line: it will not run. True when it was there.
    pub fn delete_parked(
        &self,
        key: &[u8],
        token: &str,
        interrupt: &Interrupt,
    ) -> Result<bool, LockError> {
        let lock = self.redis_key(key);
        let parked = self.keys().parked(key);
        self.pool().round_trip(&lock, interrupt, None, |conn, _| {
            let entry = parked_entry_of(conn, &parked, token)?;
            if entry.is_empty() {
                return Ok(false);
            }
            let removed: i64 = redis::cmd("LREM")
                .arg(&parked)
                .arg(1)
                .arg(entry)
                .query(conn)?;
            Ok(removed == 1)
        })
    }

    /// How many jobs are parked on `key`.
    pub fn parked_count(&self, key: &[u8], interrupt: &Interrupt) -> Result<u64, LockError> {
        let lock = self.redis_key(key);
        let parked = self.keys().parked(key);
        self.pool().round_trip(&lock, interrupt, None, |conn, _| {
            redis::cmd("LLEN").arg(&parked).query(conn)
        })
    }

    fn one_redis(&self, what: &str) -> Result<(), LockError> {
        if self.pool().is_cluster() {
            return Err(LockError::Argument(format!(
                "{what} needs one Redis that holds the jobs too, not a Cluster"
            )));
        }
        Ok(())
    }
}

/// The entry a job's token has in a line (for the undo of an unreplicated park).
fn parked_entry_of(
    conn: &mut redis::Connection,
    parked: &[u8],
    token: &str,
) -> redis::RedisResult<Vec<u8>> {
    let entries: Vec<Vec<u8>> = redis::cmd("LRANGE")
        .arg(parked)
        .arg(0)
        .arg(-1)
        .query(conn)?;
    Ok(entries
        .into_iter()
        .find(|entry| entry_of(entry, token))
        .unwrap_or_default())
}

/// Whether a line's entry (a JSON array, `lua/shared/park.lua`) is the job `token`'s: its first
/// element. A job's id needs no escaping in JSON.
fn entry_of(entry: &[u8], token: &str) -> bool {
    entry
        .strip_prefix(b"[\"")
        .and_then(|rest| rest.strip_prefix(token.as_bytes()))
        .is_some_and(|rest| rest.starts_with(b"\","))
}

fn parked_reply(reply: Vec<i64>) -> redis::RedisResult<Parked> {
    match reply.as_slice() {
        [1, place] => Ok(Parked::InLine(*place as u64)),
        [0, parked] => Ok(Parked::Full(*parked as u64)),
        [2, _] => Ok(Parked::HandedNow),
        _ => Err((
            redis::ErrorKind::Parse,
            "park.lua's reply is not {state, count}",
        )
            .into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_is_a_job_s_by_its_first_element() {
        let entry = br#"["jid-1",3000,1000,"schedule","{}",[["LPUSH","queue:a","{}"]],1]"#;
        assert!(entry_of(entry, "jid-1"));
        assert!(!entry_of(entry, "jid-"));
        assert!(!entry_of(entry, "jid-12"));
        assert!(!entry_of(b"{}", "jid-1"));
    }

    #[test]
    fn replies_say_in_line_full_or_handed() {
        assert_eq!(parked_reply(vec![1, 3]).unwrap(), Parked::InLine(3));
        assert_eq!(parked_reply(vec![0, 100]).unwrap(), Parked::Full(100));
        assert_eq!(parked_reply(vec![2, 0]).unwrap(), Parked::HandedNow);
        assert!(parked_reply(vec![7]).is_err());
    }
}
