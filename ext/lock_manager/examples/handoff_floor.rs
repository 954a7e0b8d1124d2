//! The floor under the gem's hand-off: the lock core's own blocking acquire and release (queue,
//! hand-off script, subscriber wake-up), driven by Rust threads with no Ruby and no GVL in the
//! way. Each worker takes `turns` turns at one key, holding it `hold_ms` each time, starting at
//! the wall-clock instant `start_at` (Unix seconds: the same in every process, so several of
//! these processes can contend as bench/handoff.rb's forked workers do).
//!
//!     cargo run --release --example handoff_floor -- redis://127.0.0.1:6380/0 key threads turns hold_ms start_at [fair]
//!
//! A lock handed over to a waiter comes with the hand-off's 2 s TTL; `acquire_until` extends it to
//! the waiter's 30 s before it returns (one round trip), here as in the gem.
//!
//! Prints one line per worker: `worker <finished at, Unix seconds> <wait> <wait> ...` (seconds
//! from calling acquire to holding the lock; bench/handoff.rb reads them).

use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use lock_manager::{
    Claim, Interrupt, LockCore, LockError, LockSettings, PoolSettings, Renewal, Request, Tls,
    Topology,
};

struct Workload {
    key: String,
    turns: usize,
    hold: Duration,
    start_at: f64,
    fair: bool,
}

fn main() -> Result<(), LockError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, key, threads, turn_count, hold_ms, start_at, rest @ ..] = args.as_slice() else {
        panic!(
            "usage: handoff_floor <redis-url> <key> <threads> <turns> <hold_ms> <start_at> [fair]"
        );
    };
    let number = |s: &String| -> f64 { s.parse().expect("a number") };
    let workload = Workload {
        key: key.clone(),
        turns: number(turn_count) as usize,
        hold: Duration::from_secs_f64(number(hold_ms) / 1000.0),
        start_at: number(start_at),
        fair: rest.first().is_some_and(|fair| fair == "fair"),
    };
    let threads = number(threads) as u32;
    let core = LockCore::new(LockSettings {
        pool: PoolSettings {
            redis_url: url.clone(),
            topology: Topology::Standalone,
            pool_size: threads,
            pool_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(5),
            read_timeout: Duration::from_secs(5),
            tls: Tls::default(),
        },
        key_prefix: b"lock:".to_vec(),
        retry_interval: Duration::from_millis(100),
        replication: None,
    })?;
    let lines = thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| scope.spawn(|| turns(&core, &workload)))
            .collect();
        workers
            .into_iter()
            .map(|worker| worker.join().expect("a worker panicked"))
            .collect::<Result<Vec<String>, LockError>>()
    })?;
    println!("{}", lines.join("\n"));
    Ok(())
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |since| since.as_secs_f64())
}

/// One worker's turns, as the line main prints.
fn turns(core: &LockCore, workload: &Workload) -> Result<String, LockError> {
    let interrupt = Interrupt::for_current_thread();
    let claim = |key: &str, token: &str, called: Instant| -> Result<(), LockError> {
        let claim = Claim {
            key: key.as_bytes(),
            token,
            request: Request {
                ttl_ms: 30_000,
                wait: Some(Duration::from_secs(30)),
                limit: 1,
                fair: workload.fair,
                renewal: Renewal::Off,
            },
        };
        let deadline = called + Duration::from_secs(30);
        core.acquire_until(&claim, called, deadline, &interrupt)?;
        Ok(())
    };
    // Connect (and start the subscriber) before the clock starts, as the Ruby workers do.
    let token = uuid::Uuid::new_v4().to_string();
    let warm_up = format!("{}:warm-up:{token}", workload.key);
    claim(&warm_up, &token, Instant::now())?;
    core.release(warm_up.as_bytes(), &token, 1, &interrupt)?;
    thread::sleep(Duration::from_secs_f64(
        (workload.start_at - unix_now()).max(0.0),
    ));
    let mut waits = Vec::with_capacity(workload.turns);
    for _ in 0..workload.turns {
        let token = uuid::Uuid::new_v4().to_string();
        let called = Instant::now();
        claim(&workload.key, &token, called)?;
        waits.push(called.elapsed().as_secs_f64());
        thread::sleep(workload.hold);
        core.release(workload.key.as_bytes(), &token, 1, &interrupt)?;
    }
    let mut line = format!("worker {:.6}", unix_now());
    for wait in waits {
        line.push_str(&format!(" {wait:.6}"));
    }
    Ok(line)
}
