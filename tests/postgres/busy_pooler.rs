//! The backend through a PgBouncer in transaction mode whose two server connections other
//! clients keep busy: each of its statement types (the conformance cases below between
//! them send every one: acquire, a waiter's refresh and leave, release and its hand-off,
//! extend, renew, the holder and waiter counts, the shared space's, admin, numeric, pools,
//! records) and the sweep, on whichever server connection the pooler gives. A statement
//! sent in two `Sync`s outside a transaction (the extended protocol) would meet another
//! server connection for its second half; every one here is a single simple-protocol
//! message.

use std::{sync::OnceLock, time::Duration};

use tower_lock::engine::postgres::sqlx::{self, Executor};
use tower_lock_test_support::{
    conformance_tests,
    postgres::{BusyClients, PgBouncer, PostgresServer},
};

use crate::harness::{backend, harness};

/// The binary's busy bouncer (2 server connections, 4 other clients), and its cluster's
/// direct URL for the listener. A cluster of its own: the load runs for the rest of the
/// binary, and the shared cluster's tests with tight timeouts (`late_refresh`, 300 ms
/// calls) must not share its backends' CPU with it.
async fn urls() -> (String, String) {
    static BUSY: OnceLock<(PostgresServer, PgBouncer, BusyClients)> = OnceLock::new();
    tokio::task::spawn_blocking(|| {
        let (server, bouncer, _) = BUSY.get_or_init(|| {
            let server = PostgresServer::start();
            let bouncer = PgBouncer::with_pool_size(&server, 2);
            // Kept for the whole binary: 10 ms statements, light on the machine.
            let busy = BusyClients::start(&bouncer.url(), 4, Duration::from_millis(10));
            (server, bouncer, busy)
        });
        (bouncer.url(), server.url())
    })
    .await
    .unwrap()
}

conformance_tests!(@in_mode [tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async {
        let (through, direct) = urls().await;
        harness(through, Some(direct)).await
    }, tower_lock::engine::Mode::Exclusive;
    try_acquire_under_contention_is_busy_with_retry_after,
    fifo_grants_in_arrival_order_with_zero_overtakes,
    timed_out_waiters_leave_no_residue,
    max_waiters_is_enforced,
    late_release_after_expiry_is_reported_and_not_applied,
    extend_adds_or_replaces_and_reacquire_resets,
    watchdog_keeps_lease_past_its_ttl,
    locked_and_owned_report_state,
);

conformance_tests!(@cases [tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async {
        let (through, direct) = urls().await;
        harness(through, Some(direct)).await
    };
    n_shared_leases_are_held_at_once_and_no_more,
    a_departed_writer_lets_the_readers_behind_it_in,
    status_tells_free_locked_reserved_and_no_expiry,
    admin_force_release_hands_the_key_to_the_next_waiter,
    numeric_compare_and_set_follows_each_comparison,
    pool_membership_and_health,
    a_record_appears_with_the_release_for_the_holder_only,
    a_record_or_tombstone_is_deleted_by_key_and_the_lock_is_left_alone,
    acquire_or_record_grants_a_free_key_and_answers_a_stored_record,
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweeps_through_a_busy_pgbouncer_succeed_and_a_failed_one_is_counted() {
    let (through, direct) = urls().await;
    let backend = backend(through, Some(direct), "busy_sweep").await;
    for _ in 0..20 {
        backend
            .sweep()
            .await
            .expect("a sweep through a busy PgBouncer in transaction mode");
    }
    assert_eq!(backend.failed_sweeps(), 0);
    // A sweep that fails (here its function is gone) is an error, and counted.
    backend
        .pool()
        .execute(sqlx::raw_sql(&format!(
            "ALTER FUNCTION \"{0}\".sweep(bigint, bigint, bigint) RENAME TO sweep_gone",
            backend.schema()
        )))
        .await
        .unwrap();
    backend
        .sweep()
        .await
        .expect_err("the sweep function is gone");
    assert_eq!(backend.failed_sweeps(), 1);
}
