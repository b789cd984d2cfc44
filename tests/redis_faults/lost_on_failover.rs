//! `lost()` never lags a second holder, under Sentinel: a failover is a server with
//! another run id. A node holds a key when its primary is killed; Sentinel promotes the
//! replica. Had the replica missed the grant (asynchronous replication loses the last
//! writes), it would hand the key to the first node that asks; so the holder must have
//! been told its lease is lost before the promoted primary answers anyone.

use std::time::Duration;

use tokio::time::{Instant, timeout};
use tower_lock::{LockEngine, LockError, engine::redis::RedisBackend};
use tower_lock_test_support::redis::{SERVICE, Sentineled};
use tower_lock_test_support::serial;

async fn node(set: &Sentineled) -> LockEngine {
    LockEngine::new(
        RedisBackend::sentinel(set.sentinel_urls(), SERVICE)
            .prefix("failover")
            .command_timeout(Duration::from_secs(1))
            .build()
            .await
            .unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sentinel_failover_reports_the_lease_lost_before_the_new_primary_answers() {
    let _group = serial::group(module_path!()).await;
    let set = tokio::task::spawn_blocking(Sentineled::start)
        .await
        .unwrap();
    let holder = node(&set).await;
    let second = node(&set).await;
    // The default TTL: no renewal falls due before the failover (Sentinel waits 2 s).
    let lease = holder.lock("k").acquire().await.unwrap();
    let signal = lease.lost_signal();

    let killed = Instant::now();
    tokio::task::block_in_place(|| set.primary().kill());
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
