//! The lock algorithm against a real redis-server that each test starts on a free port.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

use lock_manager::{
    Claim, ClaimRequest, Claimed, Interrupt, KeySpace, LockCore, LockError, LockSettings,
    PoolSettings, Renewal, Request, Tls, Topology,
};

struct RedisServer {
    child: Child,
    port: u16,
}

/// Tests run in parallel: picking a free port and binding it must not interleave.
static STARTING: Mutex<()> = Mutex::new(());

impl RedisServer {
    fn start() -> RedisServer {
        let _one_at_a_time = STARTING
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        loop {
            let port = TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            // REDIS_SERVER: another server binary speaking the protocol (valkey-server).
            let binary = std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".into());
            let mut child = Command::new(&binary)
                .args([
                    "--port",
                    &port.to_string(),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                ])
                .stdout(Stdio::null())
                .spawn()
                .unwrap_or_else(|error| panic!("{binary} on PATH (bin/test installs it): {error}"));
            let started = Instant::now();
            // A server that lost the port to another process (listening or connected from it) exits:
            // then another port.
            let mut exited = false;
            while !exited && std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
                assert!(
                    started.elapsed() < Duration::from_secs(10),
                    "{binary} did not start"
                );
                thread::sleep(Duration::from_millis(10));
                exited = child.try_wait().ok().flatten().is_some();
            }
            if child.try_wait().ok().flatten().is_none() {
                return RedisServer { child, port };
            }
        }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    fn client(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .unwrap()
            .get_connection()
            .unwrap()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn core(url: &str, pool_size: u32) -> LockCore {
    LockCore::new(LockSettings {
        pool: PoolSettings {
            redis_url: url.to_string(),
            topology: Topology::Standalone,
            pool_size,
            pool_timeout: Duration::from_millis(500),
            connect_timeout: Duration::from_millis(500),
            read_timeout: Duration::from_millis(500),
            tls: Tls::default(),
        },
        key_prefix: b"t:".to_vec(),
        retry_interval: Duration::from_millis(20),
        replication: None,
    })
    .unwrap()
}

fn claim<'a>(key: &'a [u8], token: &'a str, ttl_ms: u64, limit: u32) -> Claim<'a> {
    Claim {
        key,
        token,
        request: Request {
            ttl_ms,
            wait: None,
            limit,
            fair: false,
            renewal: Renewal::Off,
        },
    }
}

fn never() -> Interrupt {
    Interrupt::for_current_thread()
}

#[test]
fn acquire_release_and_the_token_rules() {
    let server = RedisServer::start();
    let core = core(&server.url(), 2);
    let mut redis = server.client();

    assert!(core
        .try_acquire(&claim(b"k", "token-a", 10_000, 1), &never())
        .unwrap()
        .is_some());
    assert!(core
        .try_acquire(&claim(b"k", "token-b", 10_000, 1), &never())
        .unwrap()
        .is_none());
    let stored: String = redis::cmd("GET").arg("t:k").query(&mut redis).unwrap();
    assert_eq!(stored, "token-a");
    let ttl: i64 = redis::cmd("PTTL").arg("t:k").query(&mut redis).unwrap();
    assert!((9_000..=10_000).contains(&ttl));

    assert!(core.owned(b"k", "token-a", &never()).unwrap());
    assert!(!core.owned(b"k", "token-b", &never()).unwrap());
    assert!(
        !core.release(b"k", "token-b", 1, &never()).unwrap(),
        "another token must not release"
    );
    assert!(core.locked(b"k", &never()).unwrap());
    assert!(core.refresh(b"k", "token-a", 60_000, 1, &never()).unwrap());
    assert!(!core.refresh(b"k", "token-b", 60_000, 1, &never()).unwrap());
    assert!(core.release(b"k", "token-a", 1, &never()).unwrap());
    assert!(!core.release(b"k", "token-a", 1, &never()).unwrap());
    assert!(!core.locked(b"k", &never()).unwrap());
}

#[test]
fn an_expired_lock_taken_by_someone_else_is_never_released_by_the_first_owner() {
    let server = RedisServer::start();
    let core = core(&server.url(), 2);

    assert!(core
        .try_acquire(&claim(b"k", "first", 50, 1), &never())
        .unwrap()
        .is_some());
    thread::sleep(Duration::from_millis(80));
    assert!(core
        .try_acquire(&claim(b"k", "second", 10_000, 1), &never())
        .unwrap()
        .is_some());
    assert!(!core.release(b"k", "first", 1, &never()).unwrap());
    assert!(core.owned(b"k", "second", &never()).unwrap());
}

#[test]
fn blocking_acquire_waits_for_a_release_and_gives_up_at_the_deadline() {
    let server = RedisServer::start();
    let core = std::sync::Arc::new(core(&server.url(), 4));
    assert!(core
        .try_acquire(&claim(b"k", "holder", 10_000, 1), &never())
        .unwrap()
        .is_some());

    let started = Instant::now();
    let outcome = core.acquire_until(
        &claim(b"k", "waiter", 10_000, 1),
        started,
        started + Duration::from_millis(200),
        &never(),
    );
    let waited = started.elapsed();
    assert!(
        matches!(outcome, Err(LockError::NotAcquired { .. })),
        "{outcome:?}"
    );
    assert!(
        waited >= Duration::from_millis(200) && waited < Duration::from_millis(400),
        "{waited:?}"
    );

    let releaser = {
        let core = std::sync::Arc::clone(&core);
        thread::spawn(move || {
            thread::sleep(Duration::from_millis(100));
            core.release(b"k", "holder", 1, &never()).unwrap()
        })
    };
    let started = Instant::now();
    core.acquire_until(
        &claim(b"k", "waiter", 10_000, 1),
        started,
        started + Duration::from_secs(5),
        &never(),
    )
    .unwrap();
    assert!(releaser.join().unwrap());
    assert!(started.elapsed() < Duration::from_secs(1));
    assert!(core.owned(b"k", "waiter", &never()).unwrap());
}

/// How many waiters the queue of `key` holds.
fn queued(admin: &mut redis::Connection, key: &[u8]) -> i64 {
    let queue = KeySpace::new(b"t:").unwrap().lock_keys(key).queue;
    redis::cmd("ZCARD").arg(queue).query(admin).unwrap()
}

/// Runs `acquire_until` of `claim` on another thread and, once it is queued, `release`; returns
/// what the wait returned.
fn handed_over(
    core: &LockCore,
    admin: &mut redis::Connection,
    claim: &Claim,
    release: impl FnOnce(),
) -> lock_manager::Acquisition {
    thread::scope(|scope| {
        let waiter = scope.spawn(|| {
            let started = Instant::now();
            let deadline = started + Duration::from_secs(5);
            core.acquire_until(claim, started, deadline, &never())
                .unwrap()
        });
        while queued(admin, claim.key) != 1 && !waiter.is_finished() {
            thread::sleep(Duration::from_millis(5));
        }
        release();
        waiter.join().unwrap()
    })
}

#[test]
fn a_waiter_handed_the_lock_extends_it_to_its_own_ttl_before_it_returns() {
    let server = RedisServer::start();
    let core = core(&server.url(), 4);
    let mut admin = server.client();
    let holder = core
        .try_acquire(&claim(b"k", "holder", 10_000, 1), &never())
        .unwrap()
        .unwrap();
    let acquired = handed_over(&core, &mut admin, &claim(b"k", "waiter", 10_000, 1), || {
        assert!(core.release(b"k", "holder", 1, &never()).unwrap());
    });
    assert!(acquired.fencing_token > holder);
    assert!(core.owned(b"k", "waiter", &never()).unwrap());
    // The release handed it over for 2 s; the waiter returns once it lives the 10 s it asked for.
    let pttl: i64 = redis::cmd("PTTL").arg("t:k").query(&mut admin).unwrap();
    assert!((9_000..=10_000).contains(&pttl), "{pttl}");
}

#[test]
fn a_queued_waiter_that_takes_a_lock_which_expired_extends_it_to_its_own_ttl() {
    let server = RedisServer::start();
    let core = core(&server.url(), 2);
    let mut admin = server.client();
    core.try_acquire(&claim(b"k", "holder", 300, 1), &never())
        .unwrap()
        .unwrap();
    // Nobody releases: the waiter's queued attempt takes the lock once it expired, for 2 s.
    handed_over(&core, &mut admin, &claim(b"k", "waiter", 10_000, 1), || ());
    let pttl: i64 = redis::cmd("PTTL").arg("t:k").query(&mut admin).unwrap();
    assert!((9_000..=10_000).contains(&pttl), "{pttl}");
}

#[test]
fn a_waiter_handed_a_permit_extends_it_to_its_own_ttl_before_it_returns() {
    let server = RedisServer::start();
    let core = core(&server.url(), 4);
    let mut admin = server.client();
    for holder in ["a", "b"] {
        core.try_acquire(&claim(b"s", holder, 10_000, 2), &never())
            .unwrap()
            .unwrap();
    }
    handed_over(&core, &mut admin, &claim(b"s", "waiter", 20_000, 2), || {
        assert!(core.release(b"s", "a", 2, &never()).unwrap());
    });
    // The permit's expiry (Redis time, ms) is its score.
    let expiry: f64 = redis::cmd("ZSCORE")
        .arg("t:s")
        .arg("waiter")
        .query(&mut admin)
        .unwrap();
    let (seconds, micros): (f64, f64) = redis::cmd("TIME").query(&mut admin).unwrap();
    let left = expiry - (seconds * 1_000.0 + (micros / 1_000.0).floor());
    assert!((19_000.0..=20_000.0).contains(&left), "{left}");
}

#[test]
fn a_hand_over_meant_for_an_earlier_acquisition_is_not_taken_for_a_later_one() {
    let server = RedisServer::start();
    let core = core(&server.url(), 2);
    core.try_acquire(&claim(b"k", "holder", 10_000, 1), &never())
        .unwrap()
        .unwrap();
    let interrupt = never();
    // Left over on this interrupt: a hand-off is told twice (by the release's reply to a waiter
    // of the releasing process, then by its publication), and a caller may reuse its interrupt.
    interrupt.waker().hand_over(42);
    let started = Instant::now();
    let deadline = started + Duration::from_millis(300);
    let outcome = core.acquire_until(
        &claim(b"k", "waiter", 10_000, 1),
        started,
        deadline,
        &interrupt,
    );
    assert!(
        matches!(outcome, Err(LockError::NotAcquired { .. })),
        "{outcome:?}"
    );
}

#[test]
fn the_retry_path_accepts_its_own_token() {
    let server = RedisServer::start();
    let core = core(&server.url(), 1);
    let mut admin = server.client();
    assert!(core
        .try_acquire(&claim(b"k", "mine", 10_000, 1), &never())
        .unwrap()
        .is_some());
    // Kill the pooled connection: the next call retries on a new one with the idempotent script.
    let _: () = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("normal")
        .arg("SKIPME")
        .arg("yes")
        .query(&mut admin)
        .unwrap();
    assert!(
        core.try_acquire(&claim(b"k", "mine", 10_000, 1), &never())
            .unwrap()
            .is_some(),
        "re-sent acquire must not fail because of itself"
    );
    assert!(core
        .try_acquire(&claim(b"k", "other", 10_000, 1), &never())
        .unwrap()
        .is_none());
}

#[test]
fn binary_keys_round_trip() {
    let server = RedisServer::start();
    let core = core(&server.url(), 1);
    let mut redis = server.client();
    let key = b"\xff\x00{*}\"'";
    assert!(core
        .try_acquire(&claim(key, "tok", 10_000, 1), &never())
        .unwrap()
        .is_some());
    let exists: i64 = redis::cmd("EXISTS")
        .arg([b"t:".as_slice(), key].concat())
        .query(&mut redis)
        .unwrap();
    assert_eq!(exists, 1);
    assert!(core.release(key, "tok", 1, &never()).unwrap());
}

#[test]
fn an_unreachable_redis_is_a_connection_error_naming_host_and_port() {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let core = core(&format!("redis://:secret@127.0.0.1:{port}/0"), 1);
    let started = Instant::now();
    let error = core.locked(b"k", &never()).unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(1));
    match &error {
        LockError::Connection { addr, .. } => assert_eq!(addr, &format!("127.0.0.1:{port}")),
        other => panic!("expected a connection error, got {other:?}"),
    }
    assert!(!error.to_string().contains("secret"));
}

#[test]
fn a_redis_error_reply_is_a_server_error_and_keeps_the_connection() {
    let server = RedisServer::start();
    let core = core(&server.url(), 1);
    let mut redis = server.client();
    let _: () = redis::cmd("HSET")
        .arg("t:hash")
        .arg("f")
        .arg("v")
        .query(&mut redis)
        .unwrap();
    let error = core.owned(b"hash", "tok", &never()).unwrap_err();
    assert!(
        matches!(&error, LockError::Server { reply, .. } if reply.contains("WRONGTYPE")),
        "{error:?}"
    );
    assert!(!core.locked(b"other", &never()).unwrap());
    assert_eq!(core.pool().state(), (1, 1));
}

#[test]
fn an_unparseable_url_is_an_argument_error() {
    let result = LockCore::new(LockSettings {
        pool: PoolSettings {
            redis_url: "redis://127.0.0.1:notaport".into(),
            topology: Topology::Standalone,
            pool_size: 1,
            pool_timeout: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(1),
            read_timeout: Duration::from_secs(1),
            tls: Tls::default(),
        },
        key_prefix: vec![],
        retry_interval: Duration::from_millis(10),
        replication: None,
    });
    assert!(matches!(result, Err(LockError::Argument(_))));
}

#[test]
fn a_semaphore_admits_limit_holders_each_with_its_own_expiry() {
    let server = RedisServer::start();
    let core = core(&server.url(), 2);
    let mut redis = server.client();

    assert!(core
        .try_acquire(&claim(b"s", "short", 100, 3), &never())
        .unwrap()
        .is_some());
    assert!(core
        .try_acquire(&claim(b"s", "long-a", 10_000, 3), &never())
        .unwrap()
        .is_some());
    assert!(core
        .try_acquire(&claim(b"s", "long-b", 10_000, 3), &never())
        .unwrap()
        .is_some());
    assert!(core
        .try_acquire(&claim(b"s", "fourth", 10_000, 3), &never())
        .unwrap()
        .is_none());
    // A re-sent acquire of an admitted token succeeds (it only renews that holder).
    assert!(core
        .try_acquire(&claim(b"s", "long-a", 10_000, 3), &never())
        .unwrap()
        .is_some());

    thread::sleep(Duration::from_millis(150));
    // The expired holder's slot is free; the two others are untouched.
    assert!(core
        .try_acquire(&claim(b"s", "fourth", 10_000, 3), &never())
        .unwrap()
        .is_some());
    let holders: Vec<String> = redis::cmd("ZRANGE")
        .arg("t:s")
        .arg(0)
        .arg(-1)
        .query(&mut redis)
        .unwrap();
    let mut holders = holders;
    holders.sort();
    assert_eq!(holders, ["fourth", "long-a", "long-b"]);
    let pttl: i64 = redis::cmd("PTTL").arg("t:s").query(&mut redis).unwrap();
    assert!(
        (9_000..=10_000).contains(&pttl),
        "the key lives as long as its last holder: {pttl}"
    );

    assert!(core.release(b"s", "long-a", 3, &never()).unwrap());
    assert!(!core.release(b"s", "long-a", 3, &never()).unwrap());
    assert!(core
        .try_acquire(&claim(b"s", "fifth", 10_000, 3), &never())
        .unwrap()
        .is_some());
}

#[test]
fn a_semaphore_key_vanishes_with_its_last_holder() {
    let server = RedisServer::start();
    let core = core(&server.url(), 1);
    let mut redis = server.client();
    assert!(core
        .try_acquire(&claim(b"s", "a", 80, 2), &never())
        .unwrap()
        .is_some());
    thread::sleep(Duration::from_millis(120));
    let exists: i64 = redis::cmd("EXISTS").arg("t:s").query(&mut redis).unwrap();
    assert_eq!(exists, 0);
}

#[test]
fn fencing_tokens_grow_across_keys_expiry_waiters_and_a_lost_counter() {
    let server = RedisServer::start();
    let core = core(&server.url(), 2);
    let take = |key: &[u8], token: &str, ttl: u64, limit: u32| {
        core.try_acquire(&claim(key, token, ttl, limit), &never())
            .unwrap()
            .expect("free")
    };
    let first = take(b"f", "one", 50, 1);
    thread::sleep(Duration::from_millis(80)); // expired: the counter is not
    let second = take(b"f", "two", 10_000, 1);
    let other_key = take(b"g", "three", 10_000, 1);
    let shared = take(b"s", "four", 10_000, 2);
    // One counter per hash slot: a key's numbers grow; a key first used later starts higher.
    assert!(first < second && second < other_key && other_key < shared);

    // A waiter handed the lock gets the next number when it takes it.
    let waited = thread::scope(|scope| {
        let waiter = scope.spawn(|| {
            let now = Instant::now();
            core.acquire_until(
                &claim(b"f", "waiter", 10_000, 1),
                now,
                now + Duration::from_secs(5),
                &never(),
            )
            .unwrap()
            .fencing_token
        });
        thread::sleep(Duration::from_millis(100));
        assert!(core.release(b"f", "two", 1, &never()).unwrap());
        waiter.join().unwrap()
    });
    assert!(waited > second);

    // Redis restarted without persistence: the counter starts again from Redis's clock in µs,
    // above every number issued so far.
    let mut conn = server.client();
    let counters: Vec<Vec<u8>> = redis::cmd("KEYS")
        .arg("lock_manager:*:fencing")
        .query(&mut conn)
        .unwrap();
    assert_eq!(counters.len(), 3, "one per slot used: f, g, s");
    redis::cmd("DEL")
        .arg(&counters)
        .query::<()>(&mut conn)
        .unwrap();
    assert!(core.release(b"f", "waiter", 1, &never()).unwrap());
    let after_loss = take(b"f", "five", 10_000, 1);
    let now_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64;
    assert!(after_loss > waited);
    assert!(
        after_loss.abs_diff(now_us) < 60_000_000,
        "{after_loss} vs {now_us}"
    );
    assert!(core.release(b"f", "five", 1, &never()).unwrap());
    assert_eq!(take(b"f", "six", 10_000, 1), after_loss + 1);
}

#[test]
fn a_lock_whose_fencing_token_is_refused_is_not_left_held_and_the_refusal_reported() {
    let server = RedisServer::start();
    let core = core(&server.url(), 1);
    let mut admin = server.client();
    let corrupt_counter = |admin: &mut redis::Connection, key: &[u8]| {
        redis::cmd("SET")
            .arg(KeySpace::fencing_counter(&[b"t:", key].concat()))
            .arg("not a number")
            .query::<()>(admin)
            .unwrap();
    };
    let refused = |key: &[u8]| {
        let error = core
            .try_acquire(&claim(key, "mine", 10_000, 1), &never())
            .unwrap_err();
        assert!(
            matches!(&error, LockError::Server { reply, .. } if reply.contains("not an integer")),
            "{error:?}"
        );
        assert!(
            !core.locked(key, &never()).unwrap(),
            "no lock without a fencing token"
        );
        assert_eq!(
            core.pool().state(),
            (1, 1),
            "the connection is fine, and pooled"
        );
    };
    // The first acquire of a core runs as one script: the counter fails it before the SET.
    corrupt_counter(&mut admin, b"by-script");
    refused(b"by-script");
    // Once a script ran, acquires are the SET NX + INCR pipeline: the SET it made is undone.
    assert!(core
        .try_acquire(&claim(b"warm", "w", 10_000, 1), &never())
        .unwrap()
        .is_some());
    corrupt_counter(&mut admin, b"by-pipeline");
    refused(b"by-pipeline");
}

#[test]
fn claims_name_their_holder_and_renew_only_their_own() {
    let server = RedisServer::start();
    let core = core(&server.url(), 1);
    let mut redis = server.client();
    let request =
        |key: &'static [u8], token: &'static str, ttl_ms| ClaimRequest { key, token, ttl_ms };
    let first = core
        .claim_all(
            &[
                request(b"a", "jid-1", 60_000),
                request(b"b", "jid-2", 60_000),
                request(b"a", "jid-3", 60_000),
            ],
            &never(),
        )
        .unwrap();
    assert!(matches!(first[0], Claimed::Taken(_)));
    assert!(matches!(first[1], Claimed::Taken(_)));
    assert_eq!(first[2], Claimed::HeldBy(b"jid-1".to_vec()));
    // Its own token takes it again with the new TTL; another never touches it.
    let again = core
        .claim_all(&[request(b"a", "jid-1", 5_000)], &never())
        .unwrap();
    assert!(matches!(again[0], Claimed::Taken(_)));
    let ttl: i64 = redis::cmd("PTTL").arg("t:a").query(&mut redis).unwrap();
    assert!((4_000..=5_000).contains(&ttl), "{ttl}");
    assert_eq!(
        core.holder(b"a", &never()).unwrap(),
        Some(b"jid-1".to_vec())
    );
    assert!(!core.release(b"a", "jid-3", 1, &never()).unwrap());
    assert!(core.release(b"a", "jid-1", 1, &never()).unwrap());
    assert_eq!(core.holder(b"a", &never()).unwrap(), None);
    assert!(core.claim_all(&[], &never()).unwrap().is_empty());
}

/// Runs claim_push.lua for one job, `token`, with `resent`; its push one SADD and one LPUSH of
/// `payload`.
fn claim_push(
    conn: &mut redis::Connection,
    token: &str,
    resent: bool,
    payload: &str,
) -> redis::Value {
    match claim_push_all(conn, &[(token, payload)], resent) {
        redis::Value::Array(mut replies) if replies.len() == 1 => replies.remove(0),
        other => panic!("one reply per job: {other:?}"),
    }
}

/// Runs claim_push.lua for `jobs`, each (token, payload) on the lock "t:<payload's first letter>".
fn claim_push_all(
    conn: &mut redis::Connection,
    jobs: &[(&str, &str)],
    resent: bool,
) -> redis::Value {
    use lock_manager::scripts::CLAIM_PUSH;
    let locks: Vec<Vec<u8>> = jobs
        .iter()
        .map(|(_, p)| format!("t:{}", &p[..1]).into_bytes())
        .collect();
    let counters: Vec<Vec<u8>> = locks.iter().map(|l| KeySpace::fencing_counter(l)).collect();
    let mut keys: Vec<&[u8]> = Vec::new();
    let mut args: Vec<&[u8]> = vec![if resent { b"1" } else { b"0" }];
    for (at, (token, payload)) in jobs.iter().enumerate() {
        keys.extend([&locks[at][..], b"queues", b"queue:q", &counters[at][..]]);
        args.extend([
            token.as_bytes(),
            b"60000",
            b"2",
            b"0", // does not replace a pending job
            b"SADD",
            b"1",
            b"q",
            b"LPUSH",
            b"1",
        ]);
        args.push(payload.as_bytes());
    }
    CLAIM_PUSH.run(conn, &keys, &args).unwrap()
}

#[test]
fn a_claim_pushes_its_job_only_when_taken_and_a_send_again_never_pushes_twice() {
    let server = RedisServer::start();
    let mut conn = server.client();
    let queued = |conn: &mut redis::Connection| -> Vec<String> {
        redis::cmd("LRANGE")
            .arg("queue:q")
            .arg(0)
            .arg(-1)
            .query(conn)
            .unwrap()
    };

    assert!(matches!(
        claim_push(&mut conn, "jid-1", false, "a"),
        redis::Value::Int(_)
    ));
    assert_eq!(queued(&mut conn), ["a"]);
    // Sent again after a lost reply: the lock its token holds says the first send may have run.
    assert_eq!(claim_push(&mut conn, "jid-1", true, "a"), redis::Value::Nil);
    assert_eq!(queued(&mut conn), ["a"]);
    // Another job's claim of the same lock: refused, nothing pushed, sent again or not.
    for resent in [false, true] {
        let holder = claim_push(&mut conn, "jid-2", resent, "a-other");
        assert_eq!(holder, redis::Value::BulkString(b"jid-1".to_vec()));
    }
    assert_eq!(queued(&mut conn), ["a"]);
    // The same job pushed again by its own process (Sidekiq's scheduler): taken again, pushed.
    assert!(matches!(
        claim_push(&mut conn, "jid-1", false, "a2"),
        redis::Value::Int(_)
    ));
    assert_eq!(queued(&mut conn), ["a2", "a"]);
    // A batch: each job as its own claim says, in order.
    let batch = [("jid-3", "b"), ("jid-4", "b-repeat"), ("jid-5", "c")];
    let replies = claim_push_all(&mut conn, &batch, false);
    let redis::Value::Array(replies) = replies else {
        panic!("{replies:?}")
    };
    assert!(matches!(replies[0], redis::Value::Int(_)));
    assert_eq!(replies[1], redis::Value::BulkString(b"jid-3".to_vec()));
    assert!(matches!(replies[2], redis::Value::Int(_)));
    assert_eq!(queued(&mut conn), ["c", "b", "a2", "a"]);
    let members: Vec<String> = redis::cmd("SMEMBERS")
        .arg("queues")
        .query(&mut conn)
        .unwrap();
    assert_eq!(members, ["q"]);

    // Anything but Sidekiq's push commands is refused before any claim.
    use lock_manager::scripts::CLAIM_PUSH;
    let counter = KeySpace::fencing_counter(b"t:other");
    let keys: [&[u8]; 3] = [b"t:other", b"victim", &counter];
    let args: [&[u8]; 6] = [b"0", b"jid-6", b"60000", b"1", b"DEL", b"0"];
    let refused: redis::RedisResult<redis::Value> = CLAIM_PUSH.run(&mut conn, &keys, &args);
    assert!(refused
        .unwrap_err()
        .to_string()
        .contains("not a push command"));
    let exists: bool = redis::cmd("EXISTS")
        .arg("t:other")
        .query(&mut conn)
        .unwrap();
    assert!(!exists);
}
