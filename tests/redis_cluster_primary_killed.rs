//! A Redis Cluster primary killed (SIGKILL) while a lock on it is held and waited for:
//! its replica takes over, the waiters' nodes resubscribe the key's sharded channel on it
//! (one `SSUBSCRIBE` per channel: redis-rs's own batched resubscription is refused across
//! slots), and hand-offs after the failover arrive by message.
//!
//! The holder's engine waits for one replica to acknowledge its acquire (`replica_ack`),
//! so the lease held when the primary dies is on the replica that takes over. This binary has a
//! cluster of its own: the test kills one of its nodes.
#![cfg(feature = "redis-cluster")]

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use tower_lock::{LockEngine, LockError, engine::redis::RedisBackend};
use tower_lock_test_support::redis::{RedisCluster, RedisServer, is_fence_tombstone};

/// A node; with `ack`, its acquires wait for one replica (after the kill, the slot has
/// none left, so only the holder's node asks for it).
async fn node(cluster: &RedisCluster, ack: bool) -> LockEngine {
    let mut builder = RedisBackend::cluster(cluster.urls())
        .prefix("killed")
        .command_timeout(Duration::from_millis(1000));
    if ack {
        builder = builder.replica_ack(1, Duration::from_millis(500));
    }
    LockEngine::new(builder.build().await.unwrap())
}

fn subscribers(node: &RedisServer, channel: &str) -> usize {
    let out = node.cli(["PUBSUB", "SHARDNUMSUB", channel]);
    out.lines().nth(1).and_then(|n| n.parse().ok()).unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_primary_keeps_exclusion_fences_and_wake_ups_by_message() {
    let cluster = tokio::task::spawn_blocking(RedisCluster::shared)
        .await
        .unwrap();
    let nodes = [node(cluster, false).await, node(cluster, false).await];
    let holder = node(cluster, true)
        .await
        .lock("k")
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    let lock_key = cluster.scan("killed:*:lock:k").pop().expect("the lock key");
    let channel = lock_key.replacen(":lock:", ":swake:", 1);
    let slot = cluster.slot(&lock_key);

    // Two waiters per node, FIFO and not. A wait that fails while the slot has no primary
    // is answered with a backend error; the waiter then waits again (as an application
    // would), so each node keeps wanting the key's channel through the failover.
    let holding = Arc::new(AtomicBool::new(false));
    let released_at: Arc<Mutex<Option<Instant>>> = Arc::new(Mutex::new(None));
    let served = Arc::new(Mutex::new(Vec::new()));
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut waiters = Vec::new();
    for i in 0..4 {
        let engine = nodes[i % 2].clone();
        let (holding, released_at, served) = (holding.clone(), released_at.clone(), served.clone());
        waiters.push(tokio::spawn(async move {
            let mut errors = 0;
            let lease = loop {
                let wait = deadline.saturating_duration_since(Instant::now());
                let started = Instant::now();
                match engine
                    .lock("k")
                    .fifo(i % 2 == 0)
                    .ttl(Duration::from_secs(30))
                    .wait(wait)
                    .acquire()
                    .await
                {
                    Ok(lease) => break lease,
                    Err(LockError::Backend(_)) => {
                        // Answered within its wait limit (plus one call's timeouts).
                        assert!(started.elapsed() < wait + Duration::from_secs(3));
                        errors += 1;
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    Err(e) => panic!("waiter {i}: {e}"),
                }
            };
            let latency = released_at.lock().unwrap().map(|at| at.elapsed());
            assert!(!holding.swap(true, Ordering::SeqCst), "two holders");
            served.lock().unwrap().push(lease.fence());
            tokio::time::sleep(Duration::from_millis(20)).await;
            holding.store(false, Ordering::SeqCst);
            *released_at.lock().unwrap() = Some(Instant::now());
            lease.release().await.unwrap();
            (latency, errors)
        }));
    }
    let give_up = Instant::now() + Duration::from_secs(10);
    while nodes[0].lock("k").waiters().await.unwrap() != 4 {
        assert!(Instant::now() < give_up, "the waiters never queued");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert_eq!(subscribers(cluster.primary_of(slot), &channel), 2);

    let promoted = tokio::task::spawn_blocking(move || RedisCluster::shared().kill_primary(slot))
        .await
        .unwrap();
    // Both nodes resubscribe the channel on the new primary.
    let give_up = Instant::now() + Duration::from_secs(15);
    while subscribers(promoted, &channel) != 2 {
        assert!(
            Instant::now() < give_up,
            "the channel was never resubscribed on the new primary ({} subscribers)",
            subscribers(promoted, &channel)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // And the queue holds exactly the four waiters again. A waiter whose wait failed in
    // the outage could not remove its ticket; it re-registered with a new one, and the old
    // one lapses after the ticket TTL and is dropped by the live waiters' refreshes. (A
    // release before that would hand the key to the dead ticket for a claim period.)
    let queue = lock_key.replacen(":lock:", ":queue:", 1);
    let give_up = Instant::now() + Duration::from_secs(15);
    loop {
        let live = nodes[0].lock("k").waiters().await.unwrap_or(0);
        let all: usize = promoted.cli(["ZCARD", &queue]).parse().unwrap();
        if live == 4 && all == 4 {
            break;
        }
        assert!(
            Instant::now() < give_up,
            "the queue never settled: {live} live of {all}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // The acknowledged lease survived on the promoted replica.
    let first = holder.fence();
    assert!(
        nodes[1].lock("k").try_acquire().await.is_err(),
        "still held"
    );
    *released_at.lock().unwrap() = Some(Instant::now());
    holder.release().await.unwrap();
    let mut latencies = Vec::new();
    for w in waiters {
        let (latency, _errors) = w.await.unwrap();
        latencies.push(latency.expect("served after the release"));
    }
    let served = served.lock().unwrap().clone();
    assert!(
        served[0] > first && served.windows(2).all(|w| w[0] < w[1]),
        "fences rise across the failover: {first:?} then {served:?}"
    );
    latencies.sort();
    assert!(
        latencies[3] < Duration::from_millis(150),
        "hand-offs after the failover, by message: {latencies:?}"
    );
    let left: Vec<String> = tokio::task::spawn_blocking(|| RedisCluster::shared().scan("killed:*"))
        .await
        .unwrap()
        .into_iter()
        .filter(|k| !is_fence_tombstone(k))
        .collect();
    assert_eq!(left, Vec::<String>::new());
}
