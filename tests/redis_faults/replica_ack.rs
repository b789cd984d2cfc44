//! `replica_ack(n, timeout)`: `WAIT` behind the acquire script, on a real primary and
//! replica. A grant too few replicas acknowledged is given back, and the acquire fails
//! within its timeout without leaving a key behind.
#![cfg(feature = "redis")]

use std::{
    sync::OnceLock,
    time::{Duration, Instant},
};

use tower_lock::{BackendErrorKind, LockEngine, LockError, engine::redis::RedisBackend};
use tower_lock_test_support::redis::{Replicated, residue};
use tower_lock_test_support::serial;

/// One primary and one replica for the whole binary; cases keep apart by prefix, and the
/// ones that freeze the replica wait for it to thaw before they end.
fn servers() -> &'static Replicated {
    static SET: OnceLock<Replicated> = OnceLock::new();
    SET.get_or_init(|| Replicated::start(1))
}

const ACK: Duration = Duration::from_millis(300);

async fn engine(prefix: &str, replicas: usize) -> LockEngine {
    LockEngine::new(
        RedisBackend::builder(servers().primary().url())
            .prefix(prefix)
            .replica_ack(replicas, ACK)
            .build()
            .await
            .unwrap(),
    )
}

fn not_replicated(result: Result<impl std::fmt::Debug, LockError>) {
    match result {
        Err(LockError::Backend(e)) if e.kind() == BackendErrorKind::NotReplicated => {}
        other => panic!("expected a NotReplicated error, got {other:?}"),
    }
}

/// Nothing but fence tombstones under `prefix` on the primary.
fn nothing_left(prefix: &str) {
    assert_eq!(residue(servers().primary(), prefix), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acknowledged_grant_is_on_the_replica_when_the_acquire_returns() {
    let _group = serial::group(module_path!()).await;
    let _one_at_a_time = FREEZE.lock().await;
    let engine = engine("ack-ok", 1).await;
    for i in 0..20 {
        let key = format!("k{i}");
        let lease = engine.lock(&key).acquire().await.unwrap();
        // WAIT returned 1: the replica has applied the grant, with no delay to wait out.
        let on_replica = servers().replica(0).scan(&format!("ack-ok:*:lock:{key}"));
        assert_eq!(on_replica.len(), 1, "grant {key} not on the replica");
        lease.release().await.unwrap();
    }
    nothing_left("ack-ok");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_replicas_than_exist_fail_every_acquire_and_leave_no_key() {
    let _group = serial::group(module_path!()).await;
    let engine = engine("ack-too-many", 2).await;
    let started = Instant::now();
    not_replicated(engine.lock("k").acquire().await);
    let took = started.elapsed();
    assert!(
        took >= ACK && took < ACK + Duration::from_millis(500),
        "took {took:?}"
    );
    nothing_left("ack-too-many");
    // Released at once, not left to expire: a plain engine takes the key right away.
    let plain = LockEngine::new(
        RedisBackend::builder(servers().primary().url())
            .prefix("ack-too-many")
            .build()
            .await
            .unwrap(),
    );
    plain
        .lock("k")
        .try_acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_replica_fails_the_acquire_within_its_timeout_and_leaves_no_key() {
    let _group = serial::group(module_path!()).await;
    let _one_at_a_time = FREEZE.lock().await;
    let engine = engine("ack-paused", 1).await;
    // Warm up (connections, scripts), so the timing below is the WAIT's.
    engine
        .lock("warm")
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();

    let thaw = servers().replica(0).freeze(Duration::from_millis(1500));
    let started = Instant::now();
    not_replicated(engine.lock("k").acquire().await);
    let took = started.elapsed();
    assert!(
        took >= ACK && took < ACK + Duration::from_millis(400),
        "took {took:?}"
    );
    nothing_left("ack-paused");
    tokio::task::spawn_blocking(move || {
        thaw.join().unwrap();
        servers().wait_in_sync();
    })
    .await
    .unwrap();

    // Healthy again: the same acquire succeeds.
    let lease = engine.lock("k").acquire().await.unwrap();
    lease.release().await.unwrap();
}

/// A hand-off is made by the release script, which waits for no replica: the new holder
/// confirms it (re-entry plus WAIT) before it returns, and gives it back if the replica
/// does not acknowledge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handed_over_grant_is_confirmed_by_the_replicas_or_given_back() {
    let _group = serial::group(module_path!()).await;
    let _one_at_a_time = FREEZE.lock().await;
    let engine = engine("ack-handoff", 1).await;
    let other = engine.clone();
    let waiter = |engine: LockEngine| {
        tokio::spawn(async move {
            engine
                .lock("k")
                .wait(Duration::from_secs(5))
                .acquire()
                .await
        })
    };
    let queued = || {
        let other = other.clone();
        async move {
            let give_up = Instant::now() + Duration::from_secs(5);
            while other.lock("k").waiters().await.unwrap() != 1 {
                assert!(Instant::now() < give_up, "the waiter never queued");
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
    };

    // Healthy replica: the waiter gets the key, with a higher fence.
    let holder = engine.lock("k").acquire().await.unwrap();
    let w = waiter(engine.clone());
    queued().await;
    let first = holder.fence();
    holder.release().await.unwrap();
    let next = w.await.unwrap().unwrap();
    assert!(next.fence() > first);

    // Frozen replica: the hand-off reaches the waiter, which cannot confirm it.
    let w = waiter(engine.clone());
    queued().await;
    let thaw = servers().replica(0).freeze(Duration::from_millis(1500));
    next.release().await.unwrap();
    not_replicated(w.await.unwrap());
    nothing_left("ack-handoff");
    tokio::task::spawn_blocking(move || {
        thaw.join().unwrap();
        servers().wait_in_sync();
    })
    .await
    .unwrap();
}

/// The cases that freeze the one replica, or need it healthy, take turns.
static FREEZE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
