//! `lost()` never lags a second holder, on a Redis Cluster: a node holds a key when the
//! primary of its slot is killed and the replica takes over. Had the replica missed the
//! grant (asynchronous replication loses the last writes), it would hand the key to the
//! first node that asks; so the holder must have been told its lease is lost before the
//! promoted primary answers anyone.

use std::time::Duration;

use tokio::time::{Instant, timeout};
use tower_lock::{LockEngine, LockError, engine::redis::RedisBackend};
use tower_lock_test_support::redis::RedisCluster;
use tower_lock_test_support::serial;

async fn node(cluster: &RedisCluster) -> LockEngine {
    LockEngine::new(
        RedisBackend::cluster(cluster.urls())
            .prefix("cfail")
            .command_timeout(Duration::from_secs(1))
            .build()
            .await
            .unwrap(),
    )
}

/// The slot of lock `key`'s Redis keys (the engine's hash tag: FNV-1a of the key).
fn slot_of(cluster: &RedisCluster, key: &str) -> u16 {
    let tag = key.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    cluster.slot(&format!("{{{tag:016x}}}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cluster_failover_reports_the_lease_lost_before_the_new_primary_answers() {
    let _group = serial::group(module_path!()).await;
    let cluster = tokio::task::spawn_blocking(RedisCluster::start)
        .await
        .unwrap();
    let holder = node(&cluster).await;
    let second = node(&cluster).await;
    // The default TTL: no renewal falls due before the failover.
    let lease = holder.lock("k").acquire().await.unwrap();
    let signal = lease.lost_signal();
    let slot = slot_of(&cluster, "k");
    assert!(!cluster.scan("cfail:*lock:k").is_empty(), "the slot is k's");

    let killed = Instant::now();
    tokio::task::block_in_place(|| cluster.primary_of(slot).kill());
    // The second node asks for the key until a server answers (granted, or busy: the
    // replica had the grant), noting whether the lease was reported lost when it asked.
    let asking = tokio::spawn(async move {
        loop {
            let lost = signal.is_lost();
            let sent = Instant::now();
            match second.lock("k").try_acquire().await {
                Err(LockError::Backend(_)) => tokio::task::yield_now().await,
                answered => return (sent, lost, answered.is_ok()),
            }
        }
    });
    let (sent, lost, granted) = timeout(Duration::from_secs(30), asking)
        .await
        .expect("the promoted replica answers")
        .unwrap();
    assert!(
        lost,
        "the promoted primary answered (granted: {granted}) an acquire sent {:?} after the kill, before the holder's lease was reported lost",
        sent - killed
    );
    drop(lease);
}
