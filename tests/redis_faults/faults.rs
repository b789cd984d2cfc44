//! The Redis backend across processes and under faults: many OS processes sharing one
//! counter, a killed, paused and restarted server, a killed subscriber connection, a
//! crashed FIFO waiter. Each test owns its redis-server.
#![cfg(feature = "redis")]

use std::{process::Command, time::Duration};

use tokio::time::{Instant, timeout};
use tower_lock::{BackendErrorKind, LockEngine, LockError, engine::redis::RedisBackend};
use tower_lock_test_support::redis::{RedisServer, engine as redis_engine, residue};
use tower_lock_test_support::serial;

/// Set in a child process started by [`spawn_child`]: which role it plays.
const CHILD_ROLE: &str = "TOWER_LOCK_TEST_CHILD";

/// An engine on `server` under `prefix`, with a short command timeout.
async fn engine(server: &RedisServer, prefix: &str) -> LockEngine {
    redis_engine(server, prefix, Some(Duration::from_millis(300))).await
}

async fn until_waiters(engine: &LockEngine, key: &str, n: usize) {
    let give_up = Instant::now() + Duration::from_secs(10);
    while engine.lock(key).waiters().await.unwrap() != n {
        assert!(Instant::now() < give_up, "never saw {n} waiters on {key}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_work_leaves_only_expiring_tombstones() {
    let _group = serial::group(module_path!()).await;
    let server = RedisServer::start();
    let engine = engine(&server, "residue").await;
    let mut tasks = Vec::new();
    for i in 0..24 {
        let engine = engine.clone();
        tasks.push(tokio::spawn(async move {
            let key = format!("k{}", i % 4);
            let lock = engine
                .lock(&key)
                .fifo(i % 2 == 0)
                .ttl(Duration::from_secs(5));
            match i % 3 {
                // Hold briefly, release explicitly.
                0 => {
                    let lease = lock.acquire().await.unwrap();
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    lease.release().await.unwrap();
                }
                // Give up waiting quickly (may also win at once).
                1 => {
                    let _ = lock.wait(Duration::from_millis(3)).acquire().await;
                }
                // Dropped mid-wait or dropped holding.
                _ => {
                    let _ = timeout(Duration::from_millis(4), lock.acquire()).await;
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    // Dropped leases and cancelled waiters clean up in spawned tasks.
    let give_up = Instant::now() + Duration::from_secs(3);
    loop {
        let left = tokio::task::block_in_place(|| residue(&server, "residue"));
        if left.is_empty() {
            break;
        }
        assert!(Instant::now() < give_up, "residue: {left:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for k in 0..4 {
        assert_eq!(engine.lock(format!("k{k}")).waiters().await.unwrap(), 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_server_loses_leases_fails_fast_and_recovers_after_restart() {
    let _group = serial::group(module_path!()).await;
    let server = RedisServer::start();
    let engine = engine(&server, "kill").await;
    let lease = engine
        .lock("held")
        .ttl(Duration::from_millis(600))
        .acquire()
        .await
        .unwrap();
    let fence = lease.fence();

    server.kill();
    timeout(Duration::from_secs(3), lease.lost())
        .await
        .expect("a lease that cannot be renewed is reported lost");

    let started = Instant::now();
    let err = engine.lock("other").try_acquire().await.unwrap_err();
    assert!(matches!(err, LockError::Backend(_)), "{err:?}");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "failed after {:?}, not within the command timeout",
        started.elapsed()
    );
    drop(lease);

    server.restart();
    // The same engine, not rebuilt: stale pooled connections were retired by the failures.
    let next = engine
        .lock("held")
        .wait(Duration::from_secs(2))
        .acquire()
        .await
        .expect("the engine recovers after a restart");
    // The restarted server is empty, but its clock still runs ahead of the old fence.
    assert!(next.fence() > fence);
    next.release().await.unwrap();
}

/// The server's plain command connections (`CLIENT LIST TYPE normal`), the asking
/// `redis-cli` included.
fn normal_clients(server: &RedisServer) -> usize {
    server
        .cli(["CLIENT", "LIST", "TYPE", "normal"])
        .lines()
        .count()
}

/// Until the server has closed every command connection but the asking `redis-cli`'s.
async fn until_only_the_cli_is_connected(server: &RedisServer) {
    let give_up = Instant::now() + Duration::from_secs(10);
    while tokio::task::block_in_place(|| normal_clients(server)) > 1 {
        assert!(
            Instant::now() < give_up,
            "the server never closed the idle connections"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_call_after_the_server_closed_idle_connections_succeeds() {
    let _group = serial::group(module_path!()).await;
    // `timeout 1`: the server closes a connection idle for a second, as a proxy or a
    // cloud load balancer does with idle sockets.
    let server = RedisServer::start_with(["--timeout", "1"]);
    let engine = engine(&server, "idle").await;
    // Several connections in the pool.
    let leases = futures_util::future::join_all((0..4).map(|i| {
        let engine = engine.clone();
        async move { engine.lock(format!("warm-{i}")).acquire().await.unwrap() }
    }))
    .await;
    for lease in leases {
        lease.release().await.unwrap();
    }
    for spell in 0..2 {
        until_only_the_cli_is_connected(&server).await;
        // Each kind of call, first after the idle spell: a script, then a plain command.
        let lease = engine
            .lock("k")
            .try_acquire()
            .await
            .unwrap_or_else(|e| panic!("idle spell {spell}: the first call failed: {e:?}"));
        lease.release().await.unwrap();
        until_only_the_cli_is_connected(&server).await;
        let record = engine.record(&tower_lock::LockKey::new("k").unwrap()).await;
        assert!(record.is_ok(), "idle spell {spell}: {record:?}");
    }
    // A connection killed by someone else (`CLIENT KILL`, a proxy reset), not by the
    // server's own timeout: the same.
    engine
        .lock("k")
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    tokio::task::block_in_place(|| server.cli(["CLIENT", "KILL", "TYPE", "normal"]));
    // The idle spell of the scenario: the connections die while idle, then a call comes.
    // (A call that races the kill itself may be sent before the client has read the
    // close: that failure is ambiguous, and reported, not retried.) No event says when
    // the engine has read the close, so the spell is a fixed one.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let lease = engine
        .lock("k")
        .try_acquire()
        .await
        .expect("the first call after CLIENT KILL succeeds");
    lease.release().await.unwrap();
}

/// Asserts that `err` is an `Unavailable` error saying it cannot connect, and to which
/// port.
fn assert_cannot_connect(err: &dyn std::fmt::Display, kind: BackendErrorKind, port: u16) {
    let text = err.to_string();
    assert_eq!(kind, BackendErrorKind::Unavailable, "{text}");
    assert!(
        text.contains("cannot connect") && text.contains(&format!("127.0.0.1:{port}")),
        "the error does not say it cannot connect, and where: {text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_redis_is_down_calls_fail_at_once_and_work_again_once_it_is_back() {
    let _group = serial::group(module_path!()).await;
    let server = RedisServer::start();
    // A long command timeout, so that "at once" cannot be "within the timeout".
    let timeout = Duration::from_secs(2);
    let engine = redis_engine(&server, "down", Some(timeout)).await;
    engine
        .lock("k")
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();

    server.kill();
    // The first call finds out (its connection dropped, a new one is refused).
    let _ = engine.lock("k").try_acquire().await;
    for i in 0..20 {
        let started = Instant::now();
        let err = engine.lock("k").try_acquire().await.unwrap_err();
        let took = started.elapsed();
        let LockError::Backend(err) = err else {
            panic!("call {i}: {err:?}")
        };
        assert!(
            took < Duration::from_millis(100),
            "call {i} took {took:?} to fail while Redis was known to be down"
        );
        assert_cannot_connect(&err, err.kind(), server.port());
    }

    server.restart();
    // Without any call, the engine's background probe finds the server: a connection
    // that is not one of this test's `redis-cli` calls (each of which counts itself).
    let back = Instant::now();
    let mut seen = tokio::task::block_in_place(|| connections_received(&server));
    loop {
        let now = tokio::task::block_in_place(|| connections_received(&server));
        if now > seen + 1 {
            break;
        }
        seen = now;
        assert!(
            back.elapsed() < Duration::from_secs(2),
            "no probe connected within 2 s of the restart"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    loop {
        match engine.lock("k").try_acquire().await {
            Ok(lease) => {
                lease.release().await.unwrap();
                break;
            }
            Err(e) => assert!(
                back.elapsed() < Duration::from_secs(3),
                "still failing {:?} after Redis came back: {e}",
                back.elapsed()
            ),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn building_against_a_redis_that_refuses_connections_says_so() {
    let _group = serial::group(module_path!()).await;
    let server = RedisServer::start();
    server.kill();
    let started = Instant::now();
    let err = RedisBackend::builder(server.url())
        .command_timeout(Duration::from_secs(2))
        .build()
        .await
        .unwrap_err();
    assert_cannot_connect(&err, err.kind(), server.port());
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "build took {:?} to fail",
        started.elapsed()
    );
    // Nothing retries once build() has failed, and the way to start before Redis is named.
    let text = err.to_string();
    assert!(
        !text.contains("retrying") && text.contains("start_before_redis(true)"),
        "the build error does not name the fix, or promises a retry: {text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_pause_past_the_ttl_loses_the_lease_and_the_next_fence_is_higher() {
    let _group = serial::group(module_path!()).await;
    let server = RedisServer::start();
    let engine = engine(&server, "pause").await;
    let stale = engine
        .lock("paused")
        .ttl(Duration::from_millis(400))
        .acquire()
        .await
        .unwrap();

    server.cli(["CLIENT", "PAUSE", "1200", "ALL"]);
    timeout(Duration::from_secs(3), stale.lost())
        .await
        .expect("renewals time out during the pause, so the lease is lost");
    tokio::task::block_in_place(|| server.wait_ready());

    let next = engine
        .lock("paused")
        .wait(Duration::from_secs(2))
        .acquire()
        .await
        .expect("the expired lease is free after the pause");
    assert!(next.fence() > stale.fence());
    // The stale holder's late release is refused and changes nothing.
    assert!(matches!(stale.release().await, Err(LockError::NotOwned)));
    assert!(next.owned().await.unwrap());
    next.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_whose_reply_is_lost_is_released_by_its_token() {
    let _group = serial::group(module_path!()).await;
    let server = RedisServer::start();
    let engine = engine(&server, "unseen").await;
    // Warm the pool and the script cache, so the acquire below is one EVALSHA.
    engine
        .lock("k")
        .try_acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();

    // The server stops for a second; the client gives up after 300 ms, but the acquire is
    // already on the wire and lands once the server wakes up.
    let frozen = tokio::task::block_in_place(|| server.freeze(Duration::from_secs(1)));
    let err = engine
        .lock("k")
        .ttl(Duration::from_secs(60))
        .try_acquire()
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Backend(_)), "{err:?}");
    tokio::task::block_in_place(|| frozen.join().unwrap());

    // Nobody saw that grant, so the engine gives it back: the key is free long before
    // the 60 s TTL.
    let give_up = Instant::now() + Duration::from_secs(3);
    loop {
        match engine.lock("k").try_acquire().await {
            Ok(lease) => {
                lease.release().await.unwrap();
                break;
            }
            Err(LockError::Busy { .. }) => {
                assert!(
                    Instant::now() < give_up,
                    "the unseen grant was never released"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(e) => panic!("{e:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_still_acquire_when_the_subscriber_connection_is_killed() {
    let _group = serial::group(module_path!()).await;
    let server = RedisServer::start();
    let engine = engine(&server, "subkill").await;
    let holder = engine.lock("k").acquire().await.unwrap();
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            let engine = engine.clone();
            tokio::spawn(async move {
                let lease = engine
                    .lock("k")
                    .wait(Duration::from_secs(10))
                    .acquire()
                    .await?;
                let at = Instant::now();
                lease.release().await?;
                Ok::<_, LockError>(at)
            })
        })
        .collect();
    until_waiters(&engine, "k", 3).await;
    let channels = || server.cli(["PUBSUB", "CHANNELS", "subkill:*"]);
    let give_up = Instant::now() + Duration::from_secs(5);
    while channels().is_empty() {
        assert!(Instant::now() < give_up, "the waiters never subscribed");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    let killed = server.cli(["CLIENT", "KILL", "TYPE", "pubsub"]);
    // The wake-up subscriber and the session watch (subscribed so the server's idle
    // timeout spares it).
    assert_eq!(
        killed, "2",
        "one subscriber connection and one session watch per backend"
    );
    let released = Instant::now();
    holder.release().await.unwrap();
    let mut last = released;
    for w in waiters {
        let acquired = w.await.unwrap().expect("waiter acquires");
        last = last.max(acquired);
    }
    // Three hand-offs, each bounded by the fallback timer (250 ms) if its message was lost.
    assert!(
        last - released < Duration::from_millis(3 * 250 + 500),
        "hand-offs took {:?}",
        last - released
    );

    // The subscriber came back by itself: a new waiter's channel is subscribed again.
    let holder = engine.lock("k").acquire().await.unwrap();
    let waiter = {
        let engine = engine.clone();
        tokio::spawn(async move { engine.lock("k").acquire().await })
    };
    until_waiters(&engine, "k", 1).await;
    let give_up = Instant::now() + Duration::from_secs(5);
    while channels().is_empty() {
        assert!(Instant::now() < give_up, "the subscriber did not reconnect");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    holder.release().await.unwrap();
    waiter.await.unwrap().unwrap().release().await.unwrap();
}

/// A server that stops for longer than the command timeout (`DEBUG SLEEP`) while two FIFO
/// waiters wait: the one with time left keeps waiting (its failed refreshes are retried
/// within its wait) and is served as soon as the key is released after the thaw; the one
/// whose wait ran out during the freeze leaves, and its failed clean-up is retried, so its
/// ticket is not handed the key ahead of the live waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_refresh_does_not_end_a_wait() {
    let _group = serial::group(module_path!()).await;
    let server = RedisServer::start();
    let engine = engine(&server, "refresh").await;
    let holder = engine.lock("k").fifo(true).acquire().await.unwrap();
    let spawn_waiter = |wait: Duration| {
        let engine = engine.clone();
        tokio::spawn(async move {
            let lease = engine.lock("k").fifo(true).wait(wait).acquire().await?;
            Ok::<_, LockError>((Instant::now(), lease))
        })
    };
    // First in line, but its wait runs out during the freeze.
    let short = spawn_waiter(Duration::from_millis(600));
    until_waiters(&engine, "k", 1).await;
    let long = spawn_waiter(Duration::from_secs(10));
    until_waiters(&engine, "k", 2).await;

    // Three command timeouts: every refresh sent meanwhile fails.
    let frozen = tokio::task::block_in_place(|| server.freeze(Duration::from_millis(1500)));
    tokio::task::block_in_place(|| frozen.join().unwrap());
    let short = short.await.unwrap();
    assert!(short.is_err(), "the short wait ran out: {short:?}");

    let released = Instant::now();
    holder.release().await.unwrap();
    let (granted, lease) = long
        .await
        .unwrap()
        .expect("a failed refresh ended a wait with 8 s left");
    assert!(
        granted - released < Duration::from_secs(1),
        "served {:?} after the release (the gone waiter's ticket held the key?)",
        granted - released
    );
    assert!(lease.owned().await.unwrap());
    lease.release().await.unwrap();
    let left = tokio::task::block_in_place(|| residue(&server, "refresh"));
    assert!(left.is_empty(), "residue: {left:?}");
}

/// A script that keeps the server busy past `busy-reply-threshold` makes it refuse every
/// other command with `BUSY` (refused, never run later, unlike a `DEBUG SLEEP`): a waiter
/// whose wait ends meanwhile cannot remove its ticket. Its clean-up is retried until it
/// lands, so the next release hands the key to the live waiter behind it, not to the gone
/// one's ticket for a claim period.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiters_failed_clean_up_is_retried() {
    let _group = serial::group(module_path!()).await;
    let server = RedisServer::start_with(["--busy-reply-threshold", "50"]);
    let engine = engine(&server, "busy").await;
    let holder = engine.lock("k").fifo(true).acquire().await.unwrap();
    let spawn_waiter = |wait: Duration| {
        let engine = engine.clone();
        tokio::spawn(async move {
            let lease = engine.lock("k").fifo(true).wait(wait).acquire().await?;
            Ok::<_, LockError>((Instant::now(), lease))
        })
    };
    let short = spawn_waiter(Duration::from_millis(500));
    until_waiters(&engine, "k", 1).await;
    let long = spawn_waiter(Duration::from_secs(10));
    until_waiters(&engine, "k", 2).await;

    // Busy for 1.5 s: the short wait ends meanwhile, and its clean-up is refused.
    let busy = {
        let port = server.port().to_string();
        std::thread::spawn(move || {
            let script = "local function now() local t = redis.call('TIME') \
                return t[1] * 1000 + math.floor(t[2] / 1000) end \
                local start = now() while now() - start < 1500 do end return 1";
            let out = Command::new("redis-cli")
                .args(["-p", &port, "EVAL", script, "0"])
                .output()
                .unwrap();
            assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "1", "{out:?}");
        })
    };
    let short = short.await.unwrap();
    assert!(short.is_err(), "the short wait ran out: {short:?}");
    tokio::task::block_in_place(|| busy.join().unwrap());

    let released = Instant::now();
    holder.release().await.unwrap();
    let (granted, lease) = long.await.unwrap().expect("the long wait is served");
    assert!(
        granted - released < Duration::from_secs(1),
        "served {:?} after the release: the gone waiter's ticket was handed the key",
        granted - released
    );
    lease.release().await.unwrap();
    let left = tokio::task::block_in_place(|| residue(&server, "busy"));
    assert!(left.is_empty(), "residue: {left:?}");
}

/// Publishing refused after the engine was built (the user's channel rights revoked): a
/// release that hands the key over says so, since the hand-off was applied, and the
/// waiter finds its grant on its fallback retry. No script applies a hand-off and then
/// reports failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_off_whose_publish_is_refused_still_reports_success() {
    let _group = serial::group(module_path!()).await;
    let server = RedisServer::start();
    let engine = engine(&server, "noperm").await;
    let holder = engine.lock("k").acquire().await.unwrap();
    let waiter = {
        let engine = engine.clone();
        tokio::spawn(async move {
            let lock = engine.lock("k").wait(Duration::from_secs(10));
            let lease = lock.acquire().await?;
            Ok::<_, LockError>((lease.token().clone(), lease))
        })
    };
    until_waiters(&engine, "k", 1).await;
    // From here on the default user may neither publish nor subscribe.
    server.cli(["ACL", "SETUSER", "default", "resetchannels"]);
    let released = holder.release().await;
    let (token, lease) = waiter.await.unwrap().expect("the waiter finds its grant");
    server.cli(["ACL", "SETUSER", "default", "allchannels"]);
    assert!(
        released.is_ok(),
        "the release handed the key over but answered {released:?}"
    );
    assert_eq!(
        engine.lock("k").holder().await.unwrap().unwrap().token,
        token
    );
    lease.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_fifo_waiter_is_dropped_from_the_queue_by_the_server_clock() {
    let _group = serial::group(module_path!()).await;
    let server = RedisServer::start();
    let engine = engine(&server, "crash").await;
    let holder = engine.lock("q").fifo(true).acquire().await.unwrap();

    // A FIFO waiter in another process, first in the queue, then SIGKILLed: no cleanup runs.
    let mut child = spawn_child("fifo-waiter", &server, "crash");
    until_waiters(&engine, "q", 1).await;
    let behind = {
        let engine = engine.clone();
        tokio::spawn(async move {
            engine
                .lock("q")
                .fifo(true)
                .wait(Duration::from_secs(20))
                .acquire()
                .await
        })
    };
    until_waiters(&engine, "q", 2).await;
    child.kill().unwrap();
    child.wait().unwrap();

    let released = Instant::now();
    holder.release().await.unwrap();
    let lease = behind.await.unwrap().expect("the queue moves on");
    let waited = released.elapsed();
    // The dead head's ticket lapses 3 s after its last refresh; then the next retry wins.
    assert!(
        waited < Duration::from_secs(5),
        "queue stalled for {waited:?}"
    );
    lease.release().await.unwrap();
    assert_eq!(engine.lock("q").waiters().await.unwrap(), 0);
    let left = tokio::task::block_in_place(|| residue(&server, "crash"));
    assert!(left.is_empty(), "residue: {left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_processes_increment_a_shared_counter_exactly() {
    let _group = serial::group(module_path!()).await;
    const PROCESSES: usize = 20;
    const INCREMENTS: usize = 100;
    let server = RedisServer::start();
    let children: Vec<_> = (0..PROCESSES)
        .map(|_| spawn_child("counter", &server, "multi"))
        .collect();
    let statuses = tokio::task::spawn_blocking(move || {
        children
            .into_iter()
            .map(|mut c| c.wait().unwrap())
            .collect::<Vec<_>>()
    })
    .await
    .unwrap();
    assert!(statuses.iter().all(|s| s.success()), "{statuses:?}");
    // GET then SET is a lost update waiting to happen: only mutual exclusion across all
    // processes makes the count exact.
    assert_eq!(
        server.cli(["GET", "counter"]),
        (PROCESSES * INCREMENTS).to_string()
    );
    let left = tokio::task::block_in_place(|| residue(&server, "multi"));
    assert!(left.is_empty(), "residue: {left:?}");
}

/// Re-run this test binary as a child process playing `role` (see [`child_process_entry`]).
fn spawn_child(role: &str, server: &RedisServer, prefix: &str) -> std::process::Child {
    let url = server.url();
    let env = [
        (CHILD_ROLE, role),
        ("TOWER_LOCK_TEST_REDIS", url.as_str()),
        ("TOWER_LOCK_TEST_PREFIX", prefix),
    ];
    crate::child::rerun(module_path!(), "child_process_entry", &env)
}

/// The entry point of child processes; in the parent run it checks nothing and returns.
#[tokio::test]
async fn child_process_entry() {
    let Ok(role) = std::env::var(CHILD_ROLE) else {
        return;
    };
    let url = std::env::var("TOWER_LOCK_TEST_REDIS").unwrap();
    let prefix = std::env::var("TOWER_LOCK_TEST_PREFIX").unwrap();
    let backend = RedisBackend::builder(url)
        .prefix(prefix)
        .build()
        .await
        .unwrap();
    let engine = LockEngine::new(backend);
    match role.as_str() {
        "fifo-waiter" => {
            // Wait until killed.
            let _ = engine.lock("q").fifo(true).acquire().await;
            unreachable!("the parent never releases to this waiter while it lives");
        }
        "counter" => {
            let client =
                redis::Client::open(std::env::var("TOWER_LOCK_TEST_REDIS").unwrap()).unwrap();
            let mut conn = client.get_multiplexed_async_connection().await.unwrap();
            for _ in 0..100 {
                let lease = engine
                    .lock("counter")
                    .wait(Duration::from_secs(60))
                    .acquire()
                    .await
                    .unwrap();
                let value: Option<u64> = redis::cmd("GET")
                    .arg("counter")
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                let () = redis::cmd("SET")
                    .arg("counter")
                    .arg(value.unwrap_or(0) + 1)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                lease.release().await.unwrap();
            }
        }
        other => panic!("unknown child role {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_started_before_redis_fails_fast_until_redis_is_up_then_works() {
    let _group = serial::group(module_path!()).await;
    // A fixed free port where nothing listens yet.
    let server = RedisServer::start();
    server.kill();
    let backend = RedisBackend::builder(server.url())
        .prefix("early")
        .command_timeout(Duration::from_secs(2))
        .start_before_redis(true)
        .build()
        .await
        .expect("built although redis is not up");
    let engine = LockEngine::new(backend);
    for i in 0..5 {
        let started = Instant::now();
        let LockError::Backend(err) = engine.lock("k").try_acquire().await.unwrap_err() else {
            panic!("call {i}: not a backend error")
        };
        assert!(
            started.elapsed() < Duration::from_millis(100),
            "call {i} took {:?} to fail",
            started.elapsed()
        );
        assert_cannot_connect(&err, err.kind(), server.port());
    }

    server.restart();
    let up = Instant::now();
    let lease = loop {
        match engine.lock("k").try_acquire().await {
            Ok(lease) => break lease,
            Err(e) => assert!(
                up.elapsed() < Duration::from_secs(3),
                "still failing {:?} after redis came up: {e}",
                up.elapsed()
            ),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // Waiting works too: the subscriber found the server by itself.
    let waiter = {
        let engine = engine.clone();
        tokio::spawn(async move {
            engine
                .lock("k")
                .wait(Duration::from_secs(5))
                .acquire()
                .await
        })
    };
    until_waiters(&engine, "k", 1).await;
    lease.release().await.unwrap();
    waiter.await.unwrap().unwrap().release().await.unwrap();
}

/// `total_connections_received` from `INFO stats`.
fn connections_received(server: &RedisServer) -> u64 {
    server
        .cli(["INFO", "stats"])
        .lines()
        .find_map(|l| l.strip_prefix("total_connections_received:"))
        .expect("INFO stats has total_connections_received")
        .trim()
        .parse()
        .unwrap()
}

/// The ids of `user`'s plain command connections.
fn command_connections(server: &RedisServer, user: &str) -> Vec<String> {
    server
        .cli(["CLIENT", "LIST", "TYPE", "normal"])
        .lines()
        .filter(|l| l.contains(&format!(" user={user} ")))
        .filter_map(|l| l.strip_prefix("id=")?.split(' ').next().map(str::to_owned))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_refused_its_channels_backs_off_and_leaves_the_command_pool_alone() {
    let _group = serial::group(module_path!()).await;
    let server = RedisServer::start();
    // A user with every right, so that the backend builds; then its channel rights go
    // (Redis 7 creates users without any, `resetchannels`).
    server.cli([
        "ACL", "SETUSER", "locks", "on", ">secret", "~*", "&*", "+@all",
    ]);
    let url = format!("redis://locks:secret@127.0.0.1:{}", server.port());
    let backend = RedisBackend::builder(url)
        .prefix("acl")
        .build()
        .await
        .unwrap();
    let engine = LockEngine::new(backend);
    let holder = engine.lock("k").acquire().await.unwrap();
    let pool = tokio::task::block_in_place(|| command_connections(&server, "locks"));
    assert!(!pool.is_empty());
    server.cli(["ACL", "SETUSER", "locks", "resetchannels"]);

    let before = tokio::task::block_in_place(|| connections_received(&server));
    // A waiter: the subscriber tries to subscribe to its channel, and is refused.
    let waited = engine
        .lock("k")
        .wait(Duration::from_secs(1))
        .acquire()
        .await;
    assert!(
        matches!(waited, Err(LockError::TimedOut { .. })),
        "{waited:?}"
    );
    let (after, still) = tokio::task::block_in_place(|| {
        (
            connections_received(&server),
            command_connections(&server, "locks"),
        )
    });
    // Two of them are the redis-cli calls of this test.
    let made = after - before;
    eprintln!("connections made during a one-second wait refused its channel: {made}");
    assert!(
        made <= 20,
        "{made} connections in one second: the subscriber reconnects in a loop"
    );
    let retired: Vec<_> = pool.iter().filter(|id| !still.contains(id)).collect();
    assert!(
        retired.is_empty(),
        "command connections {retired:?} were closed when the subscriber failed"
    );
    drop(holder);
}
