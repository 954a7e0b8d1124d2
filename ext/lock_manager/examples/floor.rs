//! The floor under the gem's uncontended lock cycle: what one redis-rs connection does with no
//! pool, no Ruby and no GVL in the way. Each cycle sends the gem's own two commands: EVALSHA of
//! the acquire script (SET NX PX with a fresh UUID v4 token, and the fencing token), then EVALSHA
//! of the release script (compare-and-delete, or hand-off to a queued waiter).
//!
//!     cargo run --release --example floor -- redis://127.0.0.1:6380/0 3
//!
//! Prints `floor: <cycles> cycles in <seconds> s = <rate> cycles/s` (bench/floor.rb reads it).

use std::time::{Duration, Instant};

use lock_manager::scripts::{ACQUIRE, RELEASE};

fn main() -> redis::RedisResult<()> {
    let mut args = std::env::args().skip(1);
    let url = args.next().expect("usage: floor <redis-url> [seconds]");
    let seconds: f64 = args
        .next()
        .map_or(3.0, |s| s.parse().expect("seconds must be a number"));

    let mut conn = redis::Client::open(url.as_str())?.get_connection()?;
    let key = format!("lock:floor:{}", std::process::id());
    let (queue, waiters) = (format!("{key}:queue"), format!("{key}:waiters"));
    let lock_keys: [&[u8]; 3] = [key.as_bytes(), queue.as_bytes(), waiters.as_bytes()];
    let acquire_keys: [&[u8]; 2] = [key.as_bytes(), b"lock:lock_manager:fencing_token"];

    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(seconds);
    let mut cycles: u64 = 0;
    while Instant::now() < deadline {
        let token = uuid::Uuid::new_v4().to_string();
        let fencing_token: u64 =
            ACQUIRE.run(&mut conn, &acquire_keys, &[token.as_bytes(), b"30000"])?;
        let released: i64 = RELEASE.run(&mut conn, &lock_keys, &[token.as_bytes(), b"2000"])?;
        assert!(
            fencing_token > 0 && released == 1,
            "a cycle on {key} did not take and free the lock"
        );
        cycles += 1;
    }
    let elapsed = start.elapsed().as_secs_f64();
    println!(
        "floor: {cycles} cycles in {elapsed:.2} s = {:.0} cycles/s",
        cycles as f64 / elapsed
    );
    Ok(())
}
