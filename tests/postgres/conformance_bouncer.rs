//! The conformance suite (core, shared-mode and capability cases) on Postgres through PgBouncer in transaction pooling
//! mode: every call may run on another server connection. The listener connects directly
//! (`LISTEN` needs a session of its own).

use tower_lock_test_support::{
    conformance_tests, core_conformance_tests, postgres::PostgresServer, shared_conformance_tests,
};

use crate::harness::{bouncer, harness};

/// The bouncer's URL and the cluster's, both started on first use.
async fn urls() -> (String, String) {
    tokio::task::spawn_blocking(|| (bouncer().url(), PostgresServer::shared().url()))
        .await
        .unwrap()
}

core_conformance_tests!(
    timed = #[tokio::test(flavor = "multi_thread", worker_threads = 2)],
    concurrent = #[tokio::test(flavor = "multi_thread", worker_threads = 4)],
    harness = async {
        let (through, direct) = urls().await;
        harness(through, Some(direct)).await
    },
);

shared_conformance_tests!(
    timed = #[tokio::test(flavor = "multi_thread", worker_threads = 2)],
    concurrent = #[tokio::test(flavor = "multi_thread", worker_threads = 4)],
    harness = async {
        let (through, direct) = urls().await;
        harness(through, Some(direct)).await
    },
);

// The capability cases, by name (`conformance_tests!` would run the core cases twice).
conformance_tests!(@cases [tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async {
        let (through, direct) = urls().await;
        harness(through, Some(direct)).await
    };
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
