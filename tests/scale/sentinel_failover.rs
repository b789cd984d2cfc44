//! The backend on a Sentinel-managed primary: it follows a failover. The primary is
//! killed while a lock is held and waited for; the Sentinels promote the replica; the
//! engines reconnect to it, the lease survives (its acquire was acknowledged by the
//! replica), fences keep rising and the waiters are served by message.
//!
//! A second test keeps four workers cycling the lock across a failover (see
//! `a_sentinel_failover_under_load_keeps_exclusion_fences_and_wake_ups`).
#![cfg(feature = "redis-sentinel")]

use std::time::{Duration, Instant};

use tower_lock::{LockEngine, LockError, engine::redis::RedisBackend};
use tower_lock_test_support::cycling::{Cycle, Workers, cycles};
use tower_lock_test_support::fallbacks::Fallbacks;
use tower_lock_test_support::redis::{SERVICE, Sentineled, is_fence_tombstone};
use tower_lock_test_support::serial;

/// A node under its own prefix whose every acquire waits for one replica.
async fn node_named(set: &Sentineled, prefix: &str) -> LockEngine {
    LockEngine::new(
        RedisBackend::sentinel(set.sentinel_urls(), SERVICE)
            .prefix(prefix)
            .command_timeout(Duration::from_millis(1000))
            .replica_ack(1, Duration::from_millis(500))
            .build()
            .await
            .unwrap(),
    )
}

async fn node(set: &Sentineled, ack: bool) -> LockEngine {
    let mut builder = RedisBackend::sentinel(set.sentinel_urls(), SERVICE)
        .prefix("sentinel")
        .command_timeout(Duration::from_millis(1000));
    if ack {
        builder = builder.replica_ack(1, Duration::from_millis(500));
    }
    LockEngine::new(builder.build().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sentinel_failover_is_followed() {
    let _group = serial::group(module_path!()).await;
    let set = tokio::task::spawn_blocking(Sentineled::start)
        .await
        .unwrap();
    let holders = node(&set, true).await;
    let nodes = [node(&set, false).await, node(&set, false).await];
    let held = holders
        .lock("k")
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    let first = held.fence();

    // Waiters on both nodes, queued (and subscribed) before the primary dies. A wait that
    // fails in the outage is answered with a backend error; the waiter waits again, as
    // an application would.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut waiters = Vec::new();
    for i in 0..2 {
        let engine = nodes[i].clone();
        waiters.push(tokio::spawn(async move {
            let lease = loop {
                let wait = deadline.saturating_duration_since(Instant::now());
                match engine.lock("k").wait(wait).acquire().await {
                    Ok(lease) => break lease,
                    Err(LockError::Backend(_)) => {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    Err(e) => panic!("waiter {i}: {e}"),
                }
            };
            let fence = lease.fence();
            lease.release().await.unwrap();
            (fence, Instant::now())
        }));
        let give_up = Instant::now() + Duration::from_secs(10);
        while nodes[0].lock("k").waiters().await.unwrap_or(0) != i + 1 {
            assert!(Instant::now() < give_up, "waiter {i} never queued");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    let set = std::sync::Arc::new(set);
    let killer = set.clone();
    let promoted_port = tokio::task::spawn_blocking(move || killer.kill_primary().port())
        .await
        .unwrap();
    assert_eq!(promoted_port, set.replica().port());

    // The engines follow: the acknowledged lease is still held on the new primary.
    let give_up = Instant::now() + Duration::from_secs(15);
    loop {
        match nodes[1].lock("k").try_acquire().await {
            Err(LockError::Busy { .. }) => break,
            Err(LockError::Backend(_)) => {
                assert!(Instant::now() < give_up, "never reached the new primary");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => panic!("the lease was lost in the failover: {other:?}"),
        }
    }
    // Exactly the two waiters are queued on the new primary (a ticket a failed wait could
    // not remove lapses after the ticket TTL; a release before that would hand the key to
    // it for a claim period), and both nodes' subscribers are back, on the new primary.
    let queue = set.replica().scan("sentinel:*:queue:k").pop();
    let give_up = Instant::now() + Duration::from_secs(15);
    loop {
        let live = nodes[0].lock("k").waiters().await.unwrap_or(0);
        let queue = queue
            .clone()
            .or_else(|| set.replica().scan("sentinel:*:queue:k").pop());
        let all: usize = queue
            .as_ref()
            .map_or(0, |q| set.replica().cli(["LLEN", q]).parse().unwrap_or(0));
        let subscribed: usize = queue.as_ref().map_or(0, |q| {
            let channel = q.replacen(":queue:", ":wake:", 1);
            let out = set.replica().cli(["PUBSUB", "NUMSUB", &channel]);
            out.lines().nth(1).and_then(|n| n.parse().ok()).unwrap_or(0)
        });
        if live == 2 && all == 2 && subscribed == 2 {
            break;
        }
        assert!(
            Instant::now() < give_up,
            "never settled: {live} live tickets of {all}, {subscribed} subscribers"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // The holder's engine talks to the old primary's address until a call fails there.
    let give_up = Instant::now() + Duration::from_secs(15);
    while holders.lock("k").status().await.is_err() {
        assert!(
            Instant::now() < give_up,
            "the holder never reached the new primary"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    held.release().await.unwrap();
    let released = Instant::now();
    let mut fences = Vec::new();
    let mut last = released;
    for w in waiters {
        let (fence, at) = w.await.unwrap();
        fences.push(fence);
        last = last.max(at);
    }
    fences.sort();
    assert!(
        first < fences[0] && fences[0] < fences[1],
        "{first:?} then {fences:?}"
    );
    assert!(
        last - released < Duration::from_millis(200),
        "two hand-offs by message took {:?}",
        last - released
    );
    let left: Vec<String> = set
        .replica()
        .scan("sentinel:*")
        .into_iter()
        .filter(|k| !is_fence_tombstone(k))
        .collect();
    assert_eq!(left, Vec::<String>::new());
}

/// Workers on two nodes, FIFO and not, cycling one lock while the primary is killed, the
/// Sentinels promote the replica, and the old primary comes back as its replica: no grant
/// while another holder believes its lease valid, fences rising, every acquire answered
/// within its wait limit, the lock cycling again, hand-offs by message once the failover
/// is over, and nothing left behind.
///
/// Every acquire waits for one replica (`replica_ack`), so a lease handed out before the
/// kill is on the replica that takes over; until the old primary rejoins there is none,
/// and acquires fail (`NotReplicated`) and are asked again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sentinel_failover_under_load_keeps_exclusion_fences_and_wake_ups() {
    let _group = serial::group(module_path!()).await;
    let fallbacks = Fallbacks::install();
    let set = std::sync::Arc::new(
        tokio::task::spawn_blocking(Sentineled::start)
            .await
            .unwrap(),
    );
    let nodes = [
        node_named(&set, "loaded").await,
        node_named(&set, "loaded").await,
    ];
    const CYCLE: Cycle = Cycle {
        key: "k",
        ttl: Duration::from_secs(2),
        wait: Duration::from_secs(3),
        // The attempt in flight and its WAIT, a confirming attempt, the ticket's removal.
        overrun: Duration::from_secs(4),
    };
    let mut workers = Workers::start(&nodes, 4, CYCLE);
    cycles(&mut workers.served, 10, "before the failover").await;

    let killer = set.clone();
    tokio::task::spawn_blocking(move || {
        killer.kill_primary();
        killer.rejoin_old_primary();
    })
    .await
    .unwrap();
    cycles(&mut workers.served, 20, "after the failover").await;
    // Once the queue has turned over, the hand-offs come by message again.
    fallbacks
        .lost_none_while(
            "after the failover",
            cycles(&mut workers.served, 20, "after the failover"),
        )
        .await;

    workers.stop().await;
    eprintln!(
        "sentinel under load: {} served ({} stale on arrival), {} timed out, {} backend errors",
        *workers.served.borrow(),
        workers
            .log
            .stale_on_arrival
            .load(std::sync::atomic::Ordering::SeqCst),
        workers
            .log
            .timed_out
            .load(std::sync::atomic::Ordering::SeqCst),
        workers.log.errors.load(std::sync::atomic::Ordering::SeqCst),
    );
    assert_eq!(workers.log.violations(), Vec::<String>::new());

    // Leases whose release failed run out (TTL), tickets whose removal failed lapse.
    let give_up = Instant::now() + Duration::from_secs(20);
    loop {
        let left: Vec<String> = set
            .replica()
            .scan("loaded:*")
            .into_iter()
            .filter(|k| !is_fence_tombstone(k))
            .collect();
        if left.is_empty() {
            break;
        }
        assert!(Instant::now() < give_up, "left behind: {left:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The first-listed Sentinel hangs (SIGSTOP: it accepts connections and never answers).
/// Connections made after that (the subscriber's, after its connection is killed, and a
/// new node's) still find the primary within their budget, so calls work and hand-offs
/// come by message.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hung_first_sentinel_does_not_stop_reconnects_or_wake_ups() {
    let _group = serial::group(module_path!()).await;
    let fallbacks = Fallbacks::install();
    let set = tokio::task::spawn_blocking(Sentineled::start)
        .await
        .unwrap();
    let engine = LockEngine::new(
        RedisBackend::sentinel(set.sentinel_urls(), SERVICE)
            .prefix("hung")
            .command_timeout(Duration::from_millis(500))
            .build()
            .await
            .unwrap(),
    );
    let hand_offs = |rounds: usize| {
        let engine = engine.clone();
        async move {
            for round in 0..rounds {
                let holder = engine.lock("k").acquire().await.unwrap();
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
                let give_up = Instant::now() + Duration::from_secs(5);
                while engine.lock("k").waiters().await.unwrap() == 0 {
                    assert!(Instant::now() < give_up, "round {round}: never queued");
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                holder.release().await.unwrap();
                let lease = waiter.await.unwrap().expect("the waiter is handed the key");
                lease.release().await.unwrap();
            }
        }
    };
    hand_offs(1).await;

    set.sentinel(0).suspend();
    // The subscriber's connection is lost and must be made again, with a lookup.
    let primary = set.primary();
    tokio::task::block_in_place(|| primary.cli(["CLIENT", "KILL", "TYPE", "pubsub"]));
    // A node that starts now makes every connection with a lookup too.
    let started = Instant::now();
    let late = LockEngine::new(
        RedisBackend::sentinel(set.sentinel_urls(), SERVICE)
            .prefix("hung")
            .command_timeout(Duration::from_millis(500))
            .build()
            .await
            .expect("a node starting with the first Sentinel hung"),
    );
    late.lock("other")
        .try_acquire()
        .await
        .expect("a call with the first Sentinel hung")
        .release()
        .await
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "took {:?}",
        started.elapsed()
    );
    // The subscriber is back on the primary (a waiter's channel subscribed again).
    let holder = engine.lock("k").acquire().await.unwrap();
    let waiter = {
        let engine = engine.clone();
        tokio::spawn(async move {
            let lease = engine
                .lock("k")
                .wait(Duration::from_secs(10))
                .acquire()
                .await;
            lease.unwrap().release().await.unwrap();
        })
    };
    let give_up = Instant::now() + Duration::from_secs(5);
    while tokio::task::block_in_place(|| primary.cli(["PUBSUB", "CHANNELS", "hung:*"])).is_empty() {
        assert!(
            Instant::now() < give_up,
            "the subscriber never came back with the first Sentinel hung"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    holder.release().await.unwrap();
    waiter.await.unwrap();
    // Counted on this test's prefix only: the failover tests beside it provoke fallback
    // grants of their own.
    let before = fallbacks.count_under("hung:");
    hand_offs(3).await;
    assert_eq!(
        fallbacks.count_under("hung:") - before,
        0,
        "hand-offs found by the fallback timer with the first Sentinel hung"
    );
    set.sentinel(0).resume();
}
