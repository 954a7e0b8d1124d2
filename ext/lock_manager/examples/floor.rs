//! The floor under the gem's uncontended lock cycle: what one redis-rs connection does with no
//! pool, no Ruby and no GVL in the way. Each cycle is `SET key token NX PX 30000` with a fresh
//! UUID v4 token, then EVALSHA of the compare-and-delete release script (loaded once).
//!
//!     cargo run --release --example floor -- redis://127.0.0.1:6380/0 3
//!
//! Prints `floor: <cycles> cycles in <seconds> s = <rate> cycles/s` (bench/floor.rb reads it).

use std::time::{Duration, Instant};

const RELEASE: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

fn main() -> redis::RedisResult<()> {
    let mut args = std::env::args().skip(1);
    let url = args.next().expect("usage: floor <redis-url> [seconds]");
    let seconds: f64 = args
        .next()
        .map_or(3.0, |s| s.parse().expect("seconds must be a number"));

    let mut conn = redis::Client::open(url.as_str())?.get_connection()?;
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(RELEASE)
        .query(&mut conn)?;
    let key = format!("lock:floor:{}", std::process::id());

    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(seconds);
    let mut cycles: u64 = 0;
    while Instant::now() < deadline {
        let token = uuid::Uuid::new_v4().to_string();
        let set: Option<String> = redis::cmd("SET")
            .arg(&key)
            .arg(&token)
            .arg("NX")
            .arg("PX")
            .arg(30_000)
            .query(&mut conn)?;
        let deleted: i64 = redis::cmd("EVALSHA")
            .arg(&sha)
            .arg(1)
            .arg(&key)
            .arg(&token)
            .query(&mut conn)?;
        assert!(
            set.is_some() && deleted == 1,
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
