//! A database whose sessions end after a second idle (`idle_session_timeout`) or a second
//! idle inside a transaction (`idle_in_transaction_session_timeout`). What they can affect:
//! the pool's connections, which die between requests (sqlx pings a connection when the
//! pool lends it, `test_before_acquire`, on by default, and replaces a dead one: the next
//! request works), and a request whose handler idles in the lent transaction past the
//! timeout: the server ends its session, the layer's record write and `COMMIT` fail, and the
//! answer is the documented one for a commit that did not happen (`503` with
//! `Retry-After`, nothing committed), its retry runs cleanly. The claim and the record
//! write are single messages, never idle in a transaction.

use std::{sync::Arc, time::Duration};

use http::StatusCode;
use tower_lock::sqlx::{self, Row};
use tower_lock_test_support::http::serve;

use super::database;
use crate::app::{Db, Gate, post, router, shared_url};

const SETTINGS: &[(&str, &str)] = &[
    ("idle_session_timeout", "1s"),
    ("idle_in_transaction_session_timeout", "1s"),
];

/// Waits until no session of database `name` is in `states` (`'idle'`, `'idle in
/// transaction'`), as a pool on the shared database (no timeouts) sees it.
async fn until_no_session(name: &str, states: &[&str]) {
    let monitor = crate::app::pool(&shared_url().await).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let left: i64 = sqlx::query(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND state = ANY($2)",
        )
        .persistent(false)
        .bind(name)
        .bind(states)
        .fetch_one(&monitor)
        .await
        .unwrap()
        .get(0);
        if left == 0 {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{left} sessions of {name} still {states:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// After the server ended every pooled connection (idle past a second), the next request
/// is served on a fresh one, and a retry of the first is replayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_server_ended_the_pools_idle_connections_the_next_requests_work() {
    const NAME: &str = "tx_idle_pool";
    let db = Db::new(&database(NAME, SETTINGS).await, "idle_pool").await;
    let server = serve(router(&db, db.layer(|b| b).await, Gate::new().0)).await;
    let first = post(&server, "k1", "ok", "card").await;
    assert_eq!(first.status, StatusCode::CREATED, "{}", first.text());
    until_no_session(NAME, &["idle"]).await;
    let next = post(&server, "k2", "ok", "card").await;
    assert_eq!(next.status, StatusCode::CREATED, "{}", next.text());
    until_no_session(NAME, &["idle"]).await;
    let retry = post(&server, "k1", "ok", "card").await;
    assert_eq!(
        (retry.status, retry.header("idempotent-replayed")),
        (StatusCode::CREATED, Some("true")),
        "{}",
        retry.text()
    );
    assert_eq!((db.payments().await, db.records().await), (2, 2));
}

/// A handler idle in the lent transaction past a second: the server ends its session; the
/// answer is `503` with `Retry-After`, nothing was committed (no row, no record), and the
/// retry runs once, then is replayed: the key is not blocked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_idle_in_the_transaction_past_the_timeout_commits_nothing_and_its_retry_runs() {
    const NAME: &str = "tx_idle_in_tx";
    let db = Db::new(&database(NAME, SETTINGS).await, "idle_in_tx").await;
    let (gate, mut entered) = Gate::new();
    let layer = db.layer(|b| b).await;
    let server = Arc::new(serve(router(&db, layer, gate.clone())).await);
    let first = tokio::spawn({
        let server = Arc::clone(&server);
        async move { post(&server, "k", "hang", "card").await }
    });
    entered.recv().await.unwrap();
    // Its insert is done: the session idles in the transaction until the server ends it.
    until_no_session(NAME, &["idle in transaction"]).await;
    gate.release.notify_one();
    let first = first.await.unwrap();
    assert_eq!(
        first.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        first.text()
    );
    assert!(first.header("retry-after").is_some(), "{:?}", first.headers);
    assert_eq!((db.payments().await, db.records().await), (0, 0));
    let retry = post(&server, "k", "ok", "card").await;
    assert_eq!(
        (retry.status, retry.header("idempotent-replayed")),
        (StatusCode::CREATED, None),
        "{}",
        retry.text()
    );
    let again = post(&server, "k", "ok", "card").await;
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!((db.payments().await, db.records().await), (1, 1));
}
