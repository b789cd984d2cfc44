//! A replica's restart on a Redis Cluster is not a reset: a replica grants nothing, so a
//! rolling restart of the replicas must not report the live leases lost while every
//! primary still holds them ("Failures are explicit, and only real").

use std::time::Duration;

use tokio::time::timeout;
use tower_lock::{LockEngine, engine::redis::RedisBackend};
use tower_lock_test_support::redis::{RedisCluster, RedisServer};
use tower_lock_test_support::serial;

/// The slot of lock `key`'s Redis keys (the engine's hash tag: FNV-1a of the key).
fn slot_of(cluster: &RedisCluster, key: &str) -> u16 {
    let tag = key.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    cluster.slot(&format!("{{{tag:016x}}}"))
}

fn is_watched(node: &RedisServer) -> bool {
    node.try_cli(["CLIENT", "LIST"])
        .is_some_and(|l| l.contains("name=tower-lock-watch"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replicas_restart_does_not_report_the_leases_lost() {
    let _group = serial::group(module_path!()).await;
    let cluster = tokio::task::spawn_blocking(RedisCluster::start)
        .await
        .unwrap();
    let engine = LockEngine::new(
        RedisBackend::cluster(cluster.urls())
            .prefix("crep")
            .command_timeout(Duration::from_secs(1))
            .build()
            .await
            .unwrap(),
    );
    let lease = engine
        .lock("k")
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    let slot = slot_of(&cluster, "k");
    let replica = cluster.replica_of(slot);
    // Redis 7.0 names a replica in `CLUSTER SLOTS` once it has replicated a write (the
    // grant is one), and the watch reads the topology every second: polled.
    tokio::task::block_in_place(|| {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !is_watched(replica) {
            assert!(
                std::time::Instant::now() < deadline,
                "the watch never connected to the replica"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        // SIGKILL and back on the same port: its nodes.conf makes it the same replica.
        replica.restart();
    });
    if timeout(Duration::from_millis(1500), lease.lost())
        .await
        .is_ok()
    {
        panic!("a replica's restart reported the lease lost (its primary still holds it)");
    }
    assert!(lease.owned().await.unwrap(), "the primary still holds it");
    lease.release().await.unwrap();
}
