//! A database whose `statement_timeout` (100 ms) is shorter than the waits asked for (up to
//! seconds): a wait is never one statement (a waiter's attempts are each short, and it waits
//! between them for a notification or its fallback timer), so it outlasts the timeout. The
//! cases that wait: in arrival order, to the end of the wait, with waiters given up.

use tower_lock_test_support::conformance_tests;

use super::harness_on;

const SETTINGS: &[(&str, &str)] = &[("statement_timeout", "100ms")];

conformance_tests!(@in_mode [tokio::test(flavor = "multi_thread", worker_threads = 2)]
    harness_on("m_statement_timeout", SETTINGS), tower_lock::engine::Mode::Exclusive;
    fifo_grants_in_arrival_order_with_zero_overtakes,
    acquire_times_out_after_wait_limit,
    timed_out_waiters_leave_no_residue,
    a_waiter_is_granted_when_a_shorter_successor_lease_expires,
);

/// A call that waits longer than the database's `statement_timeout` for its key's row (held
/// here by another session for 300 ms, as a busy key's concurrent calls hold it in turn on
/// a loaded server) still lands: the engine bounds its own statements, and a default meant
/// for the application's queries does not cancel a lock operation half way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_waiting_past_the_databases_statement_timeout_lands() {
    use std::time::Duration;
    use tower_lock::{LockEngine, engine::postgres::PostgresBackend};

    let url = super::database("m_statement_timeout", SETTINGS).await;
    let builder = PostgresBackend::builder(url).schema("st_row_wait");
    builder.migrate().await.unwrap();
    let backend = builder.build().await.unwrap();
    let pool = backend.pool().clone();
    let engine = LockEngine::new(backend);
    // The key's row exists once it has been held (its fence stays with it).
    engine
        .lock("k")
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let mut other = pool.begin().await.unwrap();
    let locked = sqlx::query(r#"SELECT 1 FROM "st_row_wait"."locks" WHERE key = 'k' FOR UPDATE"#)
        .fetch_all(&mut *other)
        .await
        .unwrap();
    assert_eq!(
        locked.len(),
        1,
        "the key's row is held by the other session"
    );
    let acquire = tokio::spawn(async move { engine.lock("k").try_acquire().await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    other.commit().await.unwrap();
    let acquired = acquire.await.unwrap();
    assert!(acquired.is_ok(), "{acquired:?}");
}
