//! The floor under the gem's uncontended lock cycle: what redis-rs connections do with no pool,
//! no Ruby and no GVL in the way. Each cycle sends the gem's own two round trips: the acquire
//! (SET NX PX with a fresh UUID v4 token, and INCR for the fencing token, pipelined), then EVALSHA
//! of the release script (compare-and-delete, or hand-off to a queued waiter). With `threads` > 1,
//! each thread has its own connection and its own key, as bench/locks.rb's threads do.
//!
//!     cargo run --release --example floor -- redis://127.0.0.1:6380/0 3 [threads] [cycles]
//!
//! With `cycles`, each thread makes exactly that many cycles instead of cycling for `seconds`
//! (bench/instructions.rb counts their instructions under callgrind).
//!
//! Prints `floor: <cycles> cycles in <seconds> s = <rate> cycles/s, <cpu> s CPU` (bench/floor.rb
//! and bench/locks.rb read it): the CPU of the whole process, all threads, over those cycles.

use std::time::{Duration, Instant};

use lock_manager::scripts::{self, Acquired, RELEASE};
use lock_manager::KeySpace;

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
    let limit: Option<u64> = args
        .next()
        .map(|s| s.parse().expect("cycles must be a whole number"));

    let client = redis::Client::open(url.as_str())?;
    let connections = (0..threads)
        .map(|_| client.get_connection())
        .collect::<redis::RedisResult<Vec<_>>>()?;
    let (start, cpu_start) = (Instant::now(), process_cpu_seconds());
    let deadline = start + Duration::from_secs_f64(seconds);
    let workers: Vec<_> = connections
        .into_iter()
        .enumerate()
        .map(|(i, conn)| std::thread::spawn(move || cycles(conn, i, deadline, limit)))
        .collect();
    let mut cycles: u64 = 0;
    for worker in workers {
        cycles += worker.join().expect("a floor thread panicked")?;
    }
    let elapsed = start.elapsed().as_secs_f64();
    let cpu = process_cpu_seconds() - cpu_start;
    println!(
        "floor: {cycles} cycles in {elapsed:.6} s = {:.0} cycles/s, {cpu:.6} s CPU",
        cycles as f64 / elapsed
    );
    Ok(())
}

/// CPU seconds this process has used so far, all threads (what Ruby's
/// `Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID)` reads for the gem).
fn process_cpu_seconds() -> f64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid timespec for the call to write.
    let read = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut now) };
    assert_eq!(read, 0, "clock_gettime(CLOCK_PROCESS_CPUTIME_ID) failed");
    now.tv_sec as f64 + now.tv_nsec as f64 / 1e9
}

/// Lock and unlock cycles on one connection and one key until `deadline`, or `limit` of them.
fn cycles(
    mut conn: redis::Connection,
    thread: usize,
    deadline: Instant,
    limit: Option<u64>,
) -> redis::RedisResult<u64> {
    let name = format!("floor:{}:{thread}", std::process::id());
    // The gem's own key layout, as a Locker with the default prefix builds it.
    let lock_keys = KeySpace::new(b"lock:")
        .expect("the default prefix")
        .lock_keys(name.as_bytes());
    let key = String::from_utf8_lossy(&lock_keys.lock).into_owned();
    let mut cycles: u64 = 0;
    while limit.map_or(Instant::now() < deadline, |limit| cycles < limit) {
        let token = uuid::Uuid::new_v4().to_string();
        let acquired = scripts::acquire(
            &mut conn,
            &lock_keys.lock,
            &lock_keys.fencing,
            &token,
            "30000",
            false,
        )?;
        let released: i64 =
            RELEASE.run(&mut conn, &lock_keys.all(), &[token.as_bytes(), b"2000"])?;
        assert!(
            matches!(acquired, Acquired::Taken(_)) && released == 1,
            "a cycle on {key} did not take and free the lock"
        );
        cycles += 1;
    }
    Ok(cycles)
}
