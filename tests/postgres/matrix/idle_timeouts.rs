//! A database whose sessions end after 1 s idle (`idle_session_timeout`) or 1 s idle inside
//! a transaction (`idle_in_transaction_session_timeout`): the pool's connections die
//! between calls, and so would the listener's `LISTEN` session. The cases with calls after
//! more than a second idle (renewals of a lease held past its TTL, a wait longer than a
//! second ended by a hand-off the listener hears). A call never leaves a transaction open,
//! so the second setting never fires; a call on a connection that died while idle is sent
//! again (`dead_idle`).

use std::time::Duration;

use tower_lock::engine::LockEngine;
use tower_lock_test_support::{conformance_tests, postgres::PostgresServer};

use super::{database, harness_on};
use crate::harness::backend;

const SETTINGS: &[(&str, &str)] = &[
    ("idle_session_timeout", "1s"),
    ("idle_in_transaction_session_timeout", "1s"),
];

conformance_tests!(@in_mode [tokio::test(flavor = "multi_thread", worker_threads = 2)]
    harness_on("m_idle_timeouts", SETTINGS), tower_lock::engine::Mode::Exclusive;
    watchdog_keeps_lease_past_its_ttl,
    fifo_grants_in_arrival_order_with_zero_overtakes,
);

/// A holder idle past the timeout extends its lease and releases it; a waiter that waited
/// all the while is handed the key by the release (heard by the listener, whose session the
/// timeout does not end), well before its fallback timer would matter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_idling_past_the_session_timeout_extend_release_and_hand_off_work() {
    let url = database("m_idle_timeouts", SETTINGS).await;
    let engine = LockEngine::new(backend(url, None, "m_idle_holder").await);
    let lease = engine
        .lock("k")
        .ttl(Duration::from_secs(30))
        .try_acquire()
        .await
        .unwrap();
    let waiter = {
        let engine = engine.clone();
        tokio::spawn(async move {
            engine
                .lock("k")
                .wait(Duration::from_secs(10))
                .acquire()
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(2500)).await;
    // The listener's session outlived the timeout (it turns it off for itself).
    let listening = tokio::task::spawn_blocking(|| {
        PostgresServer::shared().psql(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = 'm_idle_timeouts' \
             AND query LIKE 'LISTEN%' AND backend_start < now() - interval '2 seconds'",
        )
    })
    .await
    .unwrap();
    assert_ne!(
        listening, "0",
        "a listener session lived through 2.5 s idle"
    );
    lease
        .extend(Duration::from_secs(1))
        .await
        .expect("an extension after idling past idle_session_timeout");
    lease.release().await.expect("a release after idling");
    let granted = tokio::time::timeout(Duration::from_secs(2), waiter)
        .await
        .expect("the waiter is handed the key at the release")
        .unwrap()
        .expect("granted");
    granted.release().await.unwrap();
}
