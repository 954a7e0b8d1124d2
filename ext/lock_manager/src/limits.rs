//! Rate limits: one decision is one script run against Redis's clock (`lua/limit_*.lua`), and
//! what its reply means. How it reaches Redis is `transport.rs`'s, as for locks. A decision is
//! never undone: a reply cut short (an interrupt, a timeout) may leave its units consumed, which
//! admits less, never more; a connection found dead before any reply sends it again, likewise.
//! (The concurrency limit is the lock's own semaphore: `limit:` of a lock call.)

use std::time::{Duration, Instant};

use redis::FromRedisValue;

use crate::error::LockError;
use crate::gvl::Interrupt;
use crate::lock_core::LockCore;
use crate::scripts::{LuaScript, LIMIT_GCRA, LIMIT_SLIDING, LIMIT_WINDOW};

/// How a limiter counts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LimitKind {
    /// A smooth rate (GCRA): `count` per `period`, `burst` at once from idle.
    Gcra,
    /// At most `count` per window of `period`, the windows aligned to Redis's clock.
    Window,
    /// At most `count` in any `period` ending now, exactly.
    Sliding,
}

impl LimitKind {
    /// As Ruby names it, and as the limiter's key carries it.
    pub fn parse(name: &str) -> Option<LimitKind> {
        match name {
            "gcra" => Some(LimitKind::Gcra),
            "window" => Some(LimitKind::Window),
            "sliding" => Some(LimitKind::Sliding),
            _ => None,
        }
    }

    pub const ALL: [LimitKind; 3] = [LimitKind::Gcra, LimitKind::Window, LimitKind::Sliding];

    pub fn name(self) -> &'static [u8] {
        match self {
            LimitKind::Gcra => b"gcra",
            LimitKind::Window => b"window",
            LimitKind::Sliding => b"sliding",
        }
    }

    fn script(self) -> &'static LuaScript {
        match self {
            LimitKind::Gcra => &LIMIT_GCRA,
            LimitKind::Window => &LIMIT_WINDOW,
            LimitKind::Sliding => &LIMIT_SLIDING,
        }
    }
}

/// A limiter's rule, checked by the Ruby layer (positive numbers; `burst` at least 1).
#[derive(Clone, Copy, Debug)]
pub struct LimitRule {
    pub kind: LimitKind,
    pub count: f64,
    pub period: Duration,
    pub burst: u64,
}

/// What a limiter holds now, as its script reads it by the rule stored with its count.
#[derive(Clone, Debug, PartialEq)]
pub struct Peek {
    /// Units counted: GCRA's burst less what could go now; a window's count.
    pub used: u64,
    /// Units that could go now.
    pub remaining: u64,
    /// Until one more unit would be admitted: zero while any could.
    pub retry_after: Duration,
    /// Until the limiter is idle again.
    pub reset_after: Duration,
    /// The stored rule as its script's first two arguments: GCRA's emission interval (µs) and
    /// burst; a window's length (µs) and limit.
    pub rule: [String; 2],
}

/// One limiter: its key and the script arguments its rule makes, computed once.
pub struct Limiter {
    key: Vec<u8>,
    script: &'static LuaScript,
    /// ARGV but for the cost.
    rule_args: [String; 2],
}

/// What a decision asks for.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Ask {
    /// The units, now.
    Now,
    /// The units now, or else a promise of them (a job that will come back at `retry_after`):
    /// a refusal's receipt is then its promise.
    OrPromise,
    /// The units of a promise an earlier refusal gave (its receipt), or else another promise.
    Redeem([i64; 2]),
}

/// What one decision said.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Decision {
    pub admitted: bool,
    /// Units that could be admitted right now (after this decision).
    pub remaining: u64,
    /// Until this call would be admitted: zero when it was.
    pub retry_after: Duration,
    /// Until the limiter is idle again (full capacity).
    pub reset_after: Duration,
    /// What `give_back` needs to return the units an admitted decision took; for a refusal, the
    /// promise it holds (`Ask::Redeem` takes it), `[0, 0]` for none.
    pub receipt: [i64; 2],
}

impl LockCore {
    /// The limiter `name` (under this core's key prefix) with `rule`.
    pub fn limiter(&self, name: &[u8], rule: LimitRule) -> Limiter {
        let period_us = rule.period.as_micros();
        // GCRA: the emission interval (µs, a decimal) and the burst; a window: its length and limit.
        let rule_args = match rule.kind {
            LimitKind::Gcra => [
                format!("{}", period_us as f64 / rule.count),
                rule.burst.to_string(),
            ],
            LimitKind::Window | LimitKind::Sliding => {
                [period_us.to_string(), format!("{}", rule.count)]
            }
        };
        Limiter {
            key: self.keys().limiter(rule.kind.name(), name),
            script: rule.kind.script(),
            rule_args,
        }
    }

    /// One decision for `cost` units, one round trip.
    pub fn decide(
        &self,
        limiter: &Limiter,
        cost: u32,
        ask: Ask,
        interrupt: &Interrupt,
    ) -> Result<Decision, LockError> {
        let cost_arg = cost.to_string();
        let (mode, promise): (&[u8], _) = match ask {
            Ask::Now => (b"", [0, 0]),
            Ask::OrPromise => (b"promise", [0, 0]),
            Ask::Redeem(promise) => (b"redeem", promise),
        };
        let promise = promise.map(|n| n.to_string());
        let args: [&[u8]; 6] = [
            limiter.rule_args[0].as_bytes(),
            limiter.rule_args[1].as_bytes(),
            cost_arg.as_bytes(),
            mode,
            promise[0].as_bytes(),
            promise[1].as_bytes(),
        ];
        let (reply, acknowledged) =
            self.pool()
                .round_trip(&limiter.key, interrupt, None, |conn, _| {
                    let reply = limiter
                        .script
                        .run::<redis::Value>(conn, &[&limiter.key], &args)?;
                    let acknowledged = self.acknowledged_if(wrote(&reply), conn)?;
                    Ok((reply, acknowledged))
                })?;
        let mut decision = decision_from(reply)?;
        if !decision.admitted {
            // A promise the replicas may not have is none: a failover could forget it.
            if !self.replicated(acknowledged) {
                decision.receipt = [0, 0];
            }
            return Ok(decision);
        }
        // With `min_replicas`, an admitted decision counts once the replicas have it, as a lock's
        // acquisition: else its units are given back, so that a failover cannot forget them.
        self.undone_unless_replicated(&limiter.key, acknowledged, |undo| {
            let _ = self.give_back(limiter, cost, decision.receipt, undo);
        })?;
        Ok(decision)
    }

    /// Decides, and while refused waits out `retry_after` as long as that ends before `deadline`
    /// (Ruby may interrupt the wait): the last decision. Waiters do not queue: after a wait,
    /// another caller may take the units first, and this one waits again; a job's promise, once
    /// given, is what it asks for after each wait.
    pub fn decide_until(
        &self,
        limiter: &Limiter,
        cost: u32,
        mut ask: Ask,
        deadline: Instant,
        interrupt: &Interrupt,
    ) -> Result<Decision, LockError> {
        loop {
            let decision = self.decide(limiter, cost, ask, interrupt)?;
            let retry_at = Instant::now() + decision.retry_after;
            if decision.admitted || retry_at > deadline {
                return Ok(decision);
            }
            if ask != Ask::Now && decision.receipt != [0, 0] {
                ask = Ask::Redeem(decision.receipt);
            }
            interrupt.sleep_until(retry_at)?;
        }
    }

    /// Gives back the `cost` units an admitted decision took (its `receipt`): for a job that a
    /// later rule of its own refused, so that a refused job consumes nothing.
    pub fn give_back(
        &self,
        limiter: &Limiter,
        cost: u32,
        receipt: [i64; 2],
        interrupt: &Interrupt,
    ) -> Result<(), LockError> {
        let (cost, first, second) = (
            cost.to_string(),
            receipt[0].to_string(),
            receipt[1].to_string(),
        );
        let args: [&[u8]; 6] = [
            limiter.rule_args[0].as_bytes(),
            limiter.rule_args[1].as_bytes(),
            cost.as_bytes(),
            b"give",
            first.as_bytes(),
            second.as_bytes(),
        ];
        self.pool()
            .round_trip(&limiter.key, interrupt, None, |conn, _| {
                limiter
                    .script
                    .run::<redis::Value>(conn, &[&limiter.key], &args)
            })
            .map(|_| ())
    }

    /// What the limiter `name` of `kind` holds now, by the rule stored with its count: what one
    /// unit would meet (`Peek`), changing nothing; `None` when it is idle.
    pub fn peek(
        &self,
        kind: LimitKind,
        name: &[u8],
        interrupt: &Interrupt,
    ) -> Result<Option<Peek>, LockError> {
        let key = self.keys().limiter(kind.name(), name);
        let reply: Option<(i64, i64, i64, i64, String, String)> =
            self.pool().round_trip(&key, interrupt, None, |conn, _| {
                kind.script().run(conn, &[&key], &[b"", b"", b"1", b"peek"])
            })?;
        Ok(
            reply.map(|(used, remaining, retry, reset, first, second)| Peek {
                used: used.max(0).unsigned_abs(),
                remaining: remaining.max(0).unsigned_abs(),
                retry_after: micros(retry),
                reset_after: micros(reset),
                rule: [first, second],
            }),
        )
    }

    /// Forgets what the limiters `name` of `kinds` have counted, in one command (their keys share
    /// a slot); whether any had counted anything.
    pub fn reset_named(
        &self,
        name: &[u8],
        kinds: &[LimitKind],
        interrupt: &Interrupt,
    ) -> Result<bool, LockError> {
        let keys: Vec<Vec<u8>> = kinds
            .iter()
            .map(|kind| self.keys().limiter(kind.name(), name))
            .collect();
        self.forget(&keys, interrupt)
    }

    /// Forgets what the limiter has counted; whether it had counted anything.
    pub fn reset_limiter(
        &self,
        limiter: &Limiter,
        interrupt: &Interrupt,
    ) -> Result<bool, LockError> {
        self.forget(std::slice::from_ref(&limiter.key), interrupt)
    }

    /// Deletes limiters' keys (of one slot) in one command: whether any was there.
    fn forget(&self, keys: &[Vec<u8>], interrupt: &Interrupt) -> Result<bool, LockError> {
        let Some(first) = keys.first() else {
            return Ok(false);
        };
        self.pool().round_trip(first, interrupt, None, |conn, _| {
            redis::cmd("DEL")
                .arg(keys)
                .query::<i64>(conn)
                .map(|n| n > 0)
        })
    }
}

/// Whether a script's reply admits (its first number is 1) or promises (its receipt is not
/// `[0, 0]`): what it wrote the replicas must have. Read before the reply is read in full.
fn wrote(reply: &redis::Value) -> bool {
    use redis::Value::{Array, Int};
    let Array(numbers) = reply else {
        return false;
    };
    numbers.first() == Some(&Int(1)) || numbers.iter().skip(4).any(|n| *n != Int(0))
}

/// A script's microseconds: none below zero.
fn micros(n: i64) -> Duration {
    Duration::from_micros(n.max(0).unsigned_abs())
}

/// `{admitted, remaining, retry after µs, reset after µs, receipt, receipt}`, as every
/// `limit_*.lua` returns it.
fn decision_from(reply: redis::Value) -> Result<Decision, LockError> {
    let numbers = Vec::<i64>::from_redis_value(reply)
        .ok()
        .filter(|numbers| numbers.len() == 6)
        .ok_or_else(|| LockError::Internal("a limiter's script replied out of shape".into()))?;
    Ok(Decision {
        admitted: numbers[0] == 1,
        remaining: numbers[1].max(0).unsigned_abs(),
        retry_after: micros(numbers[2]),
        reset_after: micros(numbers[3]),
        receipt: [numbers[4], numbers[5]],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::Value;

    #[test]
    fn a_reply_reads_as_a_decision() {
        let reply = Value::Array(vec![
            Value::Int(0),
            Value::Int(2),
            Value::Int(1_500),
            Value::Int(-3),
            Value::Int(7),
            Value::Int(8),
        ]);
        let decision = decision_from(reply).unwrap();
        assert_eq!(
            decision,
            Decision {
                admitted: false,
                remaining: 2,
                retry_after: Duration::from_micros(1_500),
                reset_after: Duration::ZERO,
                receipt: [7, 8],
            }
        );
        assert!(decision_from(Value::Array(vec![Value::Int(1)])).is_err());
    }
}
