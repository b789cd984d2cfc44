//! The conformance suite on Postgres, directly connected: the core cases, the shared-mode
//! cases and the capability cases.

use tower_lock_test_support::{
    conformance_tests, core_conformance_tests, postgres::PostgresServer, shared_conformance_tests,
};

use crate::harness::harness;

/// The shared cluster's URL, started on first use (off the async threads: `initdb` takes a
/// moment).
async fn url() -> String {
    tokio::task::spawn_blocking(|| PostgresServer::shared().url())
        .await
        .unwrap()
}

core_conformance_tests!(
    timed = #[tokio::test(flavor = "multi_thread", worker_threads = 2)],
    concurrent = #[tokio::test(flavor = "multi_thread", worker_threads = 4)],
    harness = async { harness(url().await, None).await },
);

shared_conformance_tests!(
    timed = #[tokio::test(flavor = "multi_thread", worker_threads = 2)],
    concurrent = #[tokio::test(flavor = "multi_thread", worker_threads = 4)],
    harness = async { harness(url().await, None).await },
);

// The capability cases, by name (`conformance_tests!` would run the core cases twice).
conformance_tests!(@cases [tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async { harness(url().await, None).await };
    status_tells_free_locked_reserved_and_no_expiry,
    admin_force_release_hands_the_key_to_the_next_waiter,
    a_force_released_holder_reads_lost_before_its_waiter_is_granted,
            the_last_fence_bounds_every_grant_and_the_next_exceeds_it,
    numeric_compare_and_set_follows_each_comparison,
    numeric_values_expire_and_delete,
    numeric_ttls_past_the_maximum_are_refused,
    pool_membership_and_health,
    a_record_appears_with_the_release_for_the_holder_only,
    a_lapsed_holder_writes_no_record_and_keeps_the_next_holder,
    a_waiter_granted_by_a_completion_finds_the_record,
    records_expire_after_their_retention,
    a_record_or_tombstone_is_deleted_by_key_and_the_lock_is_left_alone,
    acquire_or_record_grants_a_free_key_and_answers_a_stored_record,
    acquire_or_record_after_a_wait_answers_the_record_its_holder_wrote,
);

/// Beyond the shared suite: FIFO order holds across nodes, each with its own pool and
/// listener, sharing one schema.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifo_order_holds_across_nodes() {
    use std::sync::{Arc, Mutex};

    use tower_lock::engine::{LockEngine, postgres::PostgresBackend};

    let schema = crate::harness::unique_schema("nodes");
    let url = url().await;
    let builder = PostgresBackend::builder(url).schema(&schema).pool_size(4);
    builder.migrate().await.unwrap();
    let mut nodes = Vec::new();
    for _ in 0..3 {
        nodes.push(LockEngine::new(builder.clone().build().await.unwrap()));
    }
    let holder = nodes[0].lock("k").fifo(true).acquire().await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..9 {
        let (engine, order) = (nodes[i % 3].clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let lease = engine.lock("k").fifo(true).acquire().await.unwrap();
            order.lock().unwrap().push(i);
            lease.release().await.unwrap();
        }));
        // Arrival order is defined once the waiter is queued.
        let give_up = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        while nodes[0].lock("k").waiters().await.unwrap() != i + 1 {
            assert!(
                tokio::time::Instant::now() < give_up,
                "waiter {i} never queued"
            );
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
    }
    holder.release().await.unwrap();
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(*order.lock().unwrap(), (0..9).collect::<Vec<_>>());
}
