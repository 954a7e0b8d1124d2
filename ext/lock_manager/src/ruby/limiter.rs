//! `LockManager::Native::Limiter`: the limiter a Ruby `LockManager::Limiter` holds, on the core of
//! a Locker (its pool and key prefix). Its rule arrives checked by the Ruby layer
//! (`lib/lock_manager/limiter.rb`) and is turned into script arguments once, here; each decision
//! runs without the GVL, and so does its wait.

use std::sync::Arc;
use std::time::{Duration, Instant};

use magnus::{method, prelude::*, Error, RClass, RModule, RString, Ruby, TryConvert, Value};

use crate::limits::{Ask, LimitKind, LimitRule, Limiter};
use crate::lock_core::LockCore;
use crate::request::wait_from_seconds;
use crate::ruby::call::{blocking, copy_bytes};
use crate::ruby::errors;
use crate::ruby::locker::NativeLocker;

#[magnus::wrap(class = "LockManager::Native::Limiter", free_immediately, size)]
pub struct NativeLimiter {
    core: Arc<LockCore>,
    limiter: Limiter,
    name: Vec<u8>,
}

/// `Native::Locker#limiter` makes one (after `locker::init`).
pub fn init(ruby: &Ruby, native: RModule) -> Result<(), Error> {
    let locker = native.const_get::<_, RClass>("Locker")?;
    locker.define_method("limiter", method!(NativeLimiter::new, 5))?;
    let class = native.define_class("Limiter", ruby.class_object())?;
    class.undef_default_alloc_func();
    class.define_method("decide", method!(NativeLimiter::decide, 3))?;
    class.define_method("give_back", method!(NativeLimiter::give_back, 2))?;
    class.define_method("reset", method!(NativeLimiter::reset, 0))?;
    Ok(())
}

/// A decision as Ruby receives it: `[admitted, remaining, retry_after, reset_after, receipt]`,
/// seconds; the receipt is what `give_back` takes.
type RubyDecision = (bool, u64, f64, f64, (i64, i64));

impl NativeLimiter {
    /// `kind`: "gcra", "window" or "sliding"; `count`: the rate or the limit, per `per` seconds;
    /// `burst`: GCRA's (1 for the others).
    fn new(
        ruby: &Ruby,
        locker: &NativeLocker,
        name: RString,
        kind: String,
        count: f64,
        per: f64,
        burst: u64,
    ) -> Result<NativeLimiter, Error> {
        let kind = LimitKind::parse(&kind).ok_or_else(|| {
            Error::new(
                ruby.exception_arg_error(),
                format!("unknown limiter kind {kind:?}"),
            )
        })?;
        let period = Duration::try_from_secs_f64(per)
            .map_err(|e| Error::new(ruby.exception_arg_error(), format!("per: {e}")))?;
        let rule = LimitRule {
            kind,
            count,
            period,
            burst,
        };
        let name = copy_bytes(name);
        let core = Arc::clone(locker.core());
        Ok(NativeLimiter {
            limiter: core.limiter(&name, rule),
            core,
            name,
        })
    }

    /// One decision for `cost` units; with `wait` (seconds), waits while refused as long as the
    /// wait ends by then. `promise`: for a job, nil (now), true (now or a promise), or the
    /// promise an earlier refusal's receipt held, to redeem (see `limits::Ask`).
    fn decide(
        ruby: &Ruby,
        rb_self: &Self,
        cost: u32,
        wait: Option<f64>,
        promise: Value,
    ) -> Result<RubyDecision, Error> {
        let ask = if promise.is_nil() {
            Ask::Now
        } else if promise.is_kind_of(ruby.class_true_class()) {
            Ask::OrPromise
        } else {
            let (first, second) = <(i64, i64)>::try_convert(promise)?;
            Ask::Redeem([first, second])
        };
        let deadline = wait.map(|seconds| Instant::now() + wait_from_seconds(seconds));
        let decision = blocking(ruby, rb_self.to_ruby(ruby), |interrupt| match deadline {
            None => rb_self.core.decide(&rb_self.limiter, cost, ask, interrupt),
            Some(deadline) => {
                rb_self
                    .core
                    .decide_until(&rb_self.limiter, cost, ask, deadline, interrupt)
            }
        })?;
        Ok((
            decision.admitted,
            decision.remaining,
            decision.retry_after.as_secs_f64(),
            decision.reset_after.as_secs_f64(),
            (decision.receipt[0], decision.receipt[1]),
        ))
    }

    /// Gives back the `cost` units of an admitted decision, by its receipt.
    fn give_back(ruby: &Ruby, rb_self: &Self, cost: u32, receipt: (i64, i64)) -> Result<(), Error> {
        blocking(ruby, rb_self.to_ruby(ruby), |interrupt| {
            let receipt = [receipt.0, receipt.1];
            rb_self
                .core
                .give_back(&rb_self.limiter, cost, receipt, interrupt)
        })
    }

    /// Forgets what the limiter counted; whether it had counted anything.
    fn reset(ruby: &Ruby, rb_self: &Self) -> Result<bool, Error> {
        blocking(ruby, rb_self.to_ruby(ruby), |interrupt| {
            rb_self.core.reset_limiter(&rb_self.limiter, interrupt)
        })
    }

    fn to_ruby<'a>(&'a self, ruby: &'a Ruby) -> impl FnOnce(crate::error::LockError) -> Error + 'a {
        move |error| {
            let subject = format_args!("limiter {}", errors::quote_key(&self.name));
            errors::for_subject(ruby, error, &subject)
        }
    }
}
