//! A Redis Cluster primary killed (SIGKILL) while locks on it are held and waited for: its
//! replica takes over, the waiters' nodes resubscribe the keys' sharded channels on it,
//! and hand-offs after the failover arrive by message.
//!
//! Two locks in two slots of the same primary: each node then has two sharded channels of
//! different slots on the node that dies, which redis-rs alone would resubscribe in one
//! `SSUBSCRIBE a b` that the server refuses (CROSSSLOT); the backend resubscribes them one
//! by one.
//!
//! The holders' engine waits for one replica to acknowledge its acquires (`replica_ack`),
//! so the leases held when the primary dies are on the replica that takes over. This
//! test has a cluster of its own: it kills one of its nodes.
#![cfg(feature = "redis-cluster")]

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use tokio::task::JoinHandle;
use tower_lock::{Fence, Lease, LockEngine, LockError, engine::redis::RedisBackend};
use tower_lock_test_support::redis::{RedisCluster, RedisServer, is_fence_tombstone};
use tower_lock_test_support::serial;

/// A node; with `ack`, its acquires wait for one replica (after the kill, the slot has
/// none left, so only the holders' node asks for it).
async fn node(cluster: &RedisCluster, ack: bool) -> LockEngine {
    let mut builder = RedisBackend::cluster(cluster.urls())
        .prefix("killed")
        .command_timeout(Duration::from_millis(1000));
    if ack {
        // Only the holders' two grants before the kill wait for their replica (releases
        // send no `WAIT`), so a generous bound costs nothing: with 500 ms, a CI run with two
        // test binaries at once once saw the first grant's `WAIT` time out and the test
        // fail before any fault.
        builder = builder.replica_ack(1, Duration::from_secs(5));
    }
    LockEngine::new(builder.build().await.unwrap())
}

fn subscribers(node: &RedisServer, channel: &str) -> usize {
    let out = node.cli(["PUBSUB", "SHARDNUMSUB", channel]);
    out.lines().nth(1).and_then(|n| n.parse().ok()).unwrap_or(0)
}

/// The engine's Redis name of `kind` for lock `key` (see the backend's key layout).
fn redis_name(kind: &str, key: &str) -> String {
    let tag = key.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    format!("killed:{{{tag:016x}}}:{kind}:{key}")
}

/// The waiters of one lock, spread over the nodes, FIFO and not. A wait that fails while
/// the slot has no primary is answered with a backend error within its limit; the waiter
/// then waits again (as an application would), so each node keeps wanting the channel
/// through the failover. Each checks it is alone while it holds.
struct Line {
    key: &'static str,
    holding: Arc<AtomicBool>,
    released_at: Arc<Mutex<Option<Instant>>>,
    served: Arc<Mutex<Vec<Fence>>>,
    waiters: Vec<JoinHandle<Duration>>,
}

impl Line {
    fn start(key: &'static str, nodes: &[LockEngine; 2], n: usize) -> Self {
        let mut line = Self {
            key,
            holding: Arc::default(),
            released_at: Arc::default(),
            served: Arc::default(),
            waiters: Vec::new(),
        };
        let deadline = Instant::now() + Duration::from_secs(90);
        for i in 0..n {
            let engine = nodes[i % 2].clone();
            let (holding, released_at, served) = (
                line.holding.clone(),
                line.released_at.clone(),
                line.served.clone(),
            );
            line.waiters.push(tokio::spawn(async move {
                let lease = wait_through(&engine, key, i % 2 == 0, deadline).await;
                let latency = released_at
                    .lock()
                    .unwrap()
                    .expect("served only after a release")
                    .elapsed();
                assert!(!holding.swap(true, Ordering::SeqCst), "two holders");
                served.lock().unwrap().push(lease.fence());
                tokio::time::sleep(Duration::from_millis(20)).await;
                holding.store(false, Ordering::SeqCst);
                *released_at.lock().unwrap() = Some(Instant::now());
                lease.release().await.unwrap();
                latency
            }));
        }
        line
    }

    /// Wait until exactly the line's waiters are queued: `n` live tickets and nothing else
    /// in the queue. (A waiter whose wait failed in the outage could not remove its
    /// ticket; it re-registered, and the old ticket lapses after the ticket TTL and is
    /// dropped by the live waiters' refreshes. A release before that would hand the key
    /// to the dead ticket for a claim period.)
    async fn settled(&self, engine: &LockEngine, cluster: &RedisCluster) {
        let queue = redis_name("queue", self.key);
        let slot = cluster.slot(&queue);
        let give_up = Instant::now() + Duration::from_secs(15);
        loop {
            let live = engine.lock(self.key).waiters().await.unwrap_or(0);
            let all: usize = cluster
                .primary_of(slot)
                .cli(["LLEN", &queue])
                .parse()
                .unwrap_or(0);
            if live == self.waiters.len() && all == live {
                return;
            }
            assert!(
                Instant::now() < give_up,
                "{}: the queue never settled: {live} live of {all}",
                self.key
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Release `holder`, then check every waiter was served, by message, with rising fences.
    async fn hand_over(self, holder: Lease) {
        let first = holder.fence();
        *self.released_at.lock().unwrap() = Some(Instant::now());
        holder.release().await.unwrap();
        let mut latencies = Vec::new();
        for w in self.waiters {
            latencies.push(w.await.unwrap());
        }
        let served = self.served.lock().unwrap().clone();
        assert!(
            served[0] > first && served.windows(2).all(|w| w[0] < w[1]),
            "{}: fences rise across the failover: {first:?} then {served:?}",
            self.key
        );
        // The fallback timer retries every 250 ms: served by it, a waiter would show a
        // latency of that order; by message, a hand-off takes a round trip or two.
        latencies.sort();
        assert!(
            latencies[latencies.len() - 1] < Duration::from_millis(150),
            "{}: hand-offs after the failover, by message: {latencies:?}",
            self.key
        );
    }
}

async fn wait_through(engine: &LockEngine, key: &str, fifo: bool, deadline: Instant) -> Lease {
    loop {
        let wait = deadline.saturating_duration_since(Instant::now());
        let started = Instant::now();
        match engine
            .lock(key)
            .fifo(fifo)
            .ttl(Duration::from_secs(30))
            .wait(wait)
            .acquire()
            .await
        {
            Ok(lease) => return lease,
            Err(LockError::Backend(_)) => {
                // Answered within its wait limit (plus one call's timeouts).
                assert!(started.elapsed() < wait + Duration::from_secs(3));
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("{key}: {e}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_primary_keeps_exclusion_fences_and_wake_ups_by_message() {
    let _group = serial::group(module_path!()).await;
    // A cluster of the test's own: the test kills one of its nodes.
    let cluster = &tokio::task::spawn_blocking(RedisCluster::start)
        .await
        .unwrap();
    let slot = cluster.slot(&redis_name("lock", "k"));
    // A second lock in another slot of the same primary.
    let other = tokio::task::block_in_place(|| {
        let primary = cluster.primary_of(slot).port();
        [
            "o0", "o1", "o2", "o3", "o4", "o5", "o6", "o7", "o8", "o9", "o10", "o11",
        ]
        .into_iter()
        .find(|k| {
            let s = cluster.slot(&redis_name("lock", k));
            s != slot && cluster.primary_of(s).port() == primary
        })
        .expect("a second key on the same primary")
    });

    let holders = node(cluster, true).await;
    let nodes = [node(cluster, false).await, node(cluster, false).await];
    let ttl = Duration::from_secs(30);
    let held = holders.lock("k").ttl(ttl).acquire().await.unwrap();
    let held_other = holders.lock(other).ttl(ttl).acquire().await.unwrap();
    let lines = [Line::start("k", &nodes, 4), Line::start(other, &nodes, 2)];
    for line in &lines {
        let give_up = Instant::now() + Duration::from_secs(10);
        while nodes[0].lock(line.key).waiters().await.unwrap() != line.waiters.len() {
            assert!(Instant::now() < give_up, "{}: never queued", line.key);
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let channel = redis_name("swake", line.key);
        assert_eq!(subscribers(cluster.primary_of(slot), &channel), 2);
    }

    let promoted = tokio::task::block_in_place(|| cluster.kill_primary(slot));
    // Both nodes resubscribe both channels on the new primary.
    for line in &lines {
        let channel = redis_name("swake", line.key);
        let give_up = Instant::now() + Duration::from_secs(15);
        while subscribers(promoted, &channel) != 2 {
            assert!(
                Instant::now() < give_up,
                "{channel} was never resubscribed on the new primary ({} subscribers)",
                subscribers(promoted, &channel)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        line.settled(&nodes[0], cluster).await;
    }

    // The holders' engine has not spoken since the kill: its first command meets the new
    // topology (and refreshes its view of the slots) here, not in the measured hand-off.
    let give_up = Instant::now() + Duration::from_secs(15);
    while holders.lock("k").waiters().await.is_err() {
        assert!(
            Instant::now() < give_up,
            "the holders' engine never reached the new primary"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // The acknowledged leases survived on the promoted replica, and are handed over.
    assert!(
        nodes[1].lock("k").try_acquire().await.is_err(),
        "still held"
    );
    let [line, line_other] = lines;
    line.hand_over(held).await;
    line_other.hand_over(held_other).await;

    let left: Vec<String> = tokio::task::block_in_place(|| cluster.scan("killed:*"))
        .into_iter()
        .filter(|k| !is_fence_tombstone(k))
        .collect();
    assert_eq!(left, Vec::<String>::new());
}
