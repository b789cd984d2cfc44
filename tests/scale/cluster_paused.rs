//! A Redis Cluster primary frozen while its lock is cycling among holders and waiters on
//! two nodes, FIFO and not: suspended by the OS (SIGSTOP) for less than the cluster's node
//! timeout (no failover: commands stall, time out, and land later), then for longer (the
//! replica takes over; the old primary resumes as a zombie that still believes itself
//! primary until it hears of the failover), then `CLIENT PAUSE WRITE` and `DEBUG SLEEP`
//! on the new primary.
//!
//! Throughout: no grant while another holder still believes its lease valid (the lease's
//! own validity, `is_lost`, which runs out on the engine's clock when renewals fail),
//! fences rising among valid leases, every acquire answered (served, timed out, or a
//! backend error) within its wait limit plus one call's timeouts, the lock cycling again
//! after each fault, hand-offs by message again once the failover is over, and at the end
//! no key left behind but the fence tombstone.
//!
//! The test has a cluster of its own: the faults disturb it.
#![cfg(feature = "redis-cluster")]

use std::{
    sync::{Arc, atomic::Ordering},
    time::{Duration, Instant},
};

use tower_lock::{LockEngine, engine::redis::RedisBackend};
use tower_lock_test_support::cycling::{Cycle, Workers, cycles};
use tower_lock_test_support::fallbacks::Fallbacks;
use tower_lock_test_support::redis::{RedisCluster, is_fence_tombstone};
use tower_lock_test_support::serial;

const COMMAND_TIMEOUT: Duration = Duration::from_millis(500);
const CYCLE: Cycle = Cycle {
    key: "k",
    ttl: Duration::from_secs(2),
    wait: Duration::from_secs(3),
    // The attempt in flight and the ticket's removal, each up to the command timeout.
    overrun: Duration::from_secs(2),
};

async fn node(cluster: &RedisCluster) -> LockEngine {
    LockEngine::new(
        RedisBackend::cluster(cluster.urls())
            .prefix("paused")
            .command_timeout(COMMAND_TIMEOUT)
            .build()
            .await
            .unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn frozen_primaries_keep_exclusion_fences_and_answers() {
    let _group = serial::group(module_path!()).await;
    let fallbacks = Fallbacks::install();
    // A cluster of the test's own: the faults disturb it.
    let cluster = &Arc::new(
        tokio::task::spawn_blocking(RedisCluster::start)
            .await
            .unwrap(),
    );
    let nodes = [node(cluster).await, node(cluster).await];
    // The key's slot (the lock key carries the hash tag: find it once it exists).
    let lease = nodes[0].lock("k").acquire().await.unwrap();
    let lock_key = cluster.scan("paused:*:lock:k").pop().expect("the lock key");
    let slot = cluster.slot(&lock_key);
    lease.release().await.unwrap();

    let mut workers = Workers::start(&nodes, 4, CYCLE);
    cycles(&mut workers.served, 10, "before the faults").await;

    // 1. Suspended for less than the node timeout: no failover, commands stall.
    let primary = cluster.primary_of(slot);
    primary.suspend();
    tokio::time::sleep(Duration::from_millis(700)).await;
    primary.resume();
    cycles(&mut workers.served, 10, "after a short freeze").await;

    // 2. Suspended past the node timeout: the replica is promoted; the old primary
    // resumes still believing itself primary, runs what waited in its sockets, then hears
    // of the failover and becomes a replica.
    let replica = cluster.replica_of(slot).port();
    primary.suspend();
    let own = Arc::clone(cluster);
    let promoted = tokio::task::spawn_blocking(move || {
        let cluster = own;
        let replica = cluster
            .nodes()
            .iter()
            .find(|n| n.port() == replica)
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while !replica.cli(["ROLE"]).starts_with("master") {
            assert!(Instant::now() < deadline, "the replica was never promoted");
            std::thread::sleep(Duration::from_millis(20));
        }
    })
    .await;
    primary.resume();
    promoted.unwrap();
    tokio::task::block_in_place(|| cluster.wait_healthy());
    cycles(&mut workers.served, 20, "after the failover").await;
    // Once the queue has turned over (tickets registered on the zombie are gone), the
    // hand-offs come by message again: the subscriptions the zombie ended as it was
    // demoted were renewed on the new primary.
    fallbacks
        .lost_none_while(
            "after the failover",
            cycles(&mut workers.served, 20, "after the failover"),
        )
        .await;

    // 3. Writes paused on the new primary (CLIENT PAUSE WRITE).
    let primary = cluster.primary_of(slot);
    assert_eq!(primary.cli(["CLIENT", "PAUSE", "700", "WRITE"]), "OK");
    cycles(&mut workers.served, 10, "after CLIENT PAUSE WRITE").await;

    // 4. The new primary stalls in a command (DEBUG SLEEP), under the node timeout.
    let thaw = tokio::task::block_in_place(|| primary.freeze(Duration::from_millis(700)));
    tokio::task::spawn_blocking(move || thaw.join().unwrap())
        .await
        .unwrap();
    cycles(&mut workers.served, 10, "after DEBUG SLEEP").await;

    workers.stop().await;
    let violations = workers.log.violations();
    eprintln!(
        "paused: {} served ({} stale on arrival), {} timed out, {} backend errors",
        *workers.served.borrow(),
        workers.log.stale_on_arrival.load(Ordering::SeqCst),
        workers.log.timed_out.load(Ordering::SeqCst),
        workers.log.errors.load(Ordering::SeqCst),
    );
    assert_eq!(violations, Vec::<String>::new());

    // Leases whose release failed run out (TTL), tickets whose removal failed lapse.
    let give_up = Instant::now() + Duration::from_secs(20);
    loop {
        let left: Vec<String> = tokio::task::block_in_place(|| cluster.scan("paused:*"))
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
