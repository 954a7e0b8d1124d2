//! The floor under the gem's uncontended lock cycle: what redis-rs connections do with no pool,
//! no Ruby and no GVL in the way. Each cycle sends the gem's own two round trips: the acquire
//! (SET NX PX with a fresh UUID v4 token, and INCR for the fencing token, pipelined), then EVALSHA
//! of the release script (compare-and-delete, or hand-off to a queued waiter). With `threads` > 1,
//! each thread has its own connection and its own key, as bench/locks.rb's threads do.
//!
//!     cargo run --release --example floor -- redis://127.0.0.1:6380/0 3 [threads]
//!
//! Prints `floor: <cycles> cycles in <seconds> s = <rate> cycles/s` (bench/floor.rb reads it).

use std::time::{Duration, Instant};

use lock_manager::scripts::{self, Acquired, RELEASE};

fn main() -> redis::RedisResult<()> {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .expect("usage: floor <redis-url> [seconds] [threads]");
    let seconds: f64 = args
        .next()
        .map_or(3.0, |s| s.parse().expect("seconds must be a number"));
    let threads: usize = args
        .next()
        .map_or(1, |s| s.parse().expect("threads must be a whole number"));

    let client = redis::Client::open(url.as_str())?;
    let connections = (0..threads)
        .map(|_| client.get_connection())
        .collect::<redis::RedisResult<Vec<_>>>()?;
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(seconds);
    let workers: Vec<_> = connections
        .into_iter()
        .enumerate()
        .map(|(i, conn)| std::thread::spawn(move || cycles(conn, i, deadline)))
        .collect();
    let mut cycles: u64 = 0;
    for worker in workers {
        cycles += worker.join().expect("a floor thread panicked")?;
    }
    let elapsed = start.elapsed().as_secs_f64();
    println!(
        "floor: {cycles} cycles in {elapsed:.2} s = {:.0} cycles/s",
        cycles as f64 / elapsed
    );
    Ok(())
}

/// Lock and unlock cycles on one connection and one key until `deadline`.
fn cycles(
    mut conn: redis::Connection,
    thread: usize,
    deadline: Instant,
) -> redis::RedisResult<u64> {
    let key = format!("lock:floor:{}:{thread}", std::process::id());
    let (queue, waiters) = (format!("{key}:queue"), format!("{key}:waiters"));
    let counter = b"lock:lock_manager:fencing_token";
    let lock_keys: [&[u8]; 4] = [
        key.as_bytes(),
        queue.as_bytes(),
        waiters.as_bytes(),
        counter,
    ];
    let mut cycles: u64 = 0;
    while Instant::now() < deadline {
        let token = uuid::Uuid::new_v4().to_string();
        let acquired =
            scripts::acquire(&mut conn, key.as_bytes(), counter, &token, "30000", false)?;
        let released: i64 = RELEASE.run(&mut conn, &lock_keys, &[token.as_bytes(), b"2000"])?;
        assert!(
            matches!(acquired, Acquired::Taken(_)) && released == 1,
            "a cycle on {key} did not take and free the lock"
        );
        cycles += 1;
    }
    Ok(cycles)
}
