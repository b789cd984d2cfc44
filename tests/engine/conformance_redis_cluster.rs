//! The conformance suite on a Redis Cluster (three primaries, three replicas) of our own,
//! started once for the whole binary; cases keep apart by key prefix.
//!
//! Every core case in each mode and every capability the cluster backend offers; lock pools are not
//! offered on a cluster (their health check reads every member's key in one script,
//! across slots), which the last case checks.
#![cfg(feature = "redis-cluster")]

use tower_lock::LockError;
use tower_lock_test_support::{
    conformance::{Harness, redis_cluster},
    conformance_tests, core_conformance_tests, shared_conformance_tests,
};

core_conformance_tests!(
    timed = #[tokio::test(flavor = "multi_thread", worker_threads = 2)],
    concurrent = #[tokio::test(flavor = "multi_thread", worker_threads = 4)],
    harness = redis_cluster(),
);

shared_conformance_tests!(
    timed = #[tokio::test(flavor = "multi_thread", worker_threads = 2)],
    concurrent = #[tokio::test(flavor = "multi_thread", worker_threads = 4)],
    harness = redis_cluster(),
);

conformance_tests!(@cases [tokio::test(flavor = "multi_thread", worker_threads = 2)] redis_cluster();
    status_tells_free_locked_reserved_and_no_expiry,
    admin_force_release_hands_the_key_to_the_next_waiter,
    a_force_released_holder_reads_lost_before_its_waiter_is_granted,
            the_last_fence_bounds_every_grant_and_the_next_exceeds_it,
    numeric_compare_and_set_follows_each_comparison,
    numeric_values_expire_and_delete,
    a_record_appears_with_the_release_for_the_holder_only,
    a_lapsed_holder_writes_no_record_and_keeps_the_next_holder,
    a_waiter_granted_by_a_completion_finds_the_record,
    records_expire_after_their_retention,
    a_record_or_tombstone_is_deleted_by_key_and_the_lock_is_left_alone,
);

#[tokio::test]
async fn lock_pools_are_refused_on_a_cluster_and_change_nothing() {
    let h = redis_cluster().await;
    let pool = h.engine().pool("p");
    assert!(matches!(
        pool.add(["a", "b"]).await,
        Err(LockError::Unsupported(_))
    ));
    assert!(matches!(
        pool.health().await,
        Err(LockError::Unsupported(_))
    ));
    assert_eq!(h.residue().await, Vec::<String>::new());
}

/// The fact the cluster subscriber is built around: a multi-slot `SSUBSCRIBE` (what
/// redis-rs sends a reconnected node for all its sharded channels) is refused, so the
/// backend subscribes one channel per command.
#[tokio::test]
async fn the_server_refuses_a_multi_slot_ssubscribe() {
    use tower_lock::engine::redis::redis;
    use tower_lock_test_support::redis::RedisCluster;

    let cluster = tokio::task::spawn_blocking(RedisCluster::shared)
        .await
        .unwrap();
    let (a, b) = ("p:{a}:swake:x", "p:{b}:swake:x");
    assert_ne!(cluster.slot(a), cluster.slot(b));
    let node = cluster.primary_of(cluster.slot(a));
    let client = redis::Client::open(format!("{}/?protocol=resp3", node.url())).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let refused = redis::cmd("SSUBSCRIBE")
        .arg(a)
        .arg(b)
        .query_async::<redis::Value>(&mut conn)
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Some("CROSSSLOT"), "{refused}");
    // One at a time, each is accepted by its slot's node.
    redis::cmd("SSUBSCRIBE")
        .arg(a)
        .query_async::<redis::Value>(&mut conn)
        .await
        .unwrap();
}
