//! `LockManager::Native.listen_to_leases` and `.lease_events`: what the renewal thread did (see
//! `lease_events.rs`), for the Ruby thread that turns it into `renew.lock_manager` and
//! `lost.lock_manager` events.

use magnus::{function, Error, IntoValue, RArray, RModule, Ruby, Value};

use crate::lease_events::{self, LeaseEvent};
use crate::request::wait_from_seconds;
use crate::ruby::call::blocking;
use crate::ruby::errors;

pub fn init(native: RModule) -> Result<(), Error> {
    native.define_module_function("listen_to_leases", function!(listen, 0))?;
    native.define_module_function("lease_events", function!(take, 1))?;
    Ok(())
}

fn listen() {
    lease_events::listen();
}

/// The renewals and losses since the last call, waiting up to `timeout` seconds for one:
/// `[:renewed, key, ttl_seconds]` or `[:lost, key, held_seconds, cause]` each.
fn take(ruby: &Ruby, timeout: f64) -> Result<RArray, Error> {
    let timeout = wait_from_seconds(timeout);
    let events = blocking(
        ruby,
        |e| errors::unkeyed(ruby, e),
        |interrupt| lease_events::take(interrupt, timeout),
    )?;
    let array = ruby.ary_new_capa(events.len());
    for event in events {
        array.push(to_ruby(ruby, event))?;
    }
    Ok(array)
}

fn to_ruby(ruby: &Ruby, event: LeaseEvent) -> Value {
    match event {
        LeaseEvent::Renewed { key, ttl } => (
            ruby.to_symbol("renewed"),
            ruby.str_from_slice(&key),
            ttl.as_secs_f64(),
        )
            .into_value_with(ruby),
        LeaseEvent::Lost { key, held, cause } => (
            ruby.to_symbol("lost"),
            ruby.str_from_slice(&key),
            held.as_secs_f64(),
            cause,
        )
            .into_value_with(ruby),
    }
}
