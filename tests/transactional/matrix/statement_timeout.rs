//! A database whose `statement_timeout` (300 ms) is shorter than the layer's `wait` (3 s).
//! What it can affect: the statements that wait. The claim waits on the records table's
//! unique index for a duplicate's claim (up to `wait`): it runs under a statement timeout
//! of its own, so a duplicate still waits and gets the replay, never a `57014` answered
//! `503`; the application's value is back for the handler's statements. `migrate()` waits
//! for a concurrent migration's advisory lock: it runs with `statement_timeout` and
//! `lock_timeout` off. The record write, the rollback and the sweep never wait on another
//! request (the record is the transaction's own; the sweep skips locked rows).

use std::{sync::Arc, time::Duration};

use axum::{Router, http::StatusCode, routing};
use tower_lock::{
    IdempotencyLayer, LockEngine,
    sqlx::{self, Executor, Row},
};
use tower_lock_axum::Tx;
use tower_lock_test_support::http::serve;

use super::database;
use crate::{
    app::{Db, Gate, post, router},
    behaviour::until_waiting_on_locks,
};

const SETTINGS: &[(&str, &str)] = &[("statement_timeout", "300ms")];

/// Longer than the database's `statement_timeout`: how long a waiter is kept waiting.
const PAST_THE_TIMEOUT: Duration = Duration::from_millis(800);

/// The handler's `statement_timeout`, as its own statement in the lent transaction sees it.
async fn show(mut tx: Tx) -> (StatusCode, String) {
    let shown: String = (&mut *tx)
        .fetch_one(sqlx::raw_sql("SHOW statement_timeout"))
        .await
        .unwrap()
        .get(0);
    (StatusCode::CREATED, shown)
}

/// A first request holds its claim past the timeout while a duplicate waits on it; when it
/// commits, the duplicate is replayed. The handler's statements run under the database's
/// 300 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_waits_past_a_shorter_statement_timeout_and_gets_the_replay() {
    let db = Db::new(&database("tx_statement_timeout", SETTINGS).await, "st").await;
    let (gate, mut entered) = Gate::new();
    let layer = db.layer(|b| b.wait(Duration::from_secs(3))).await;
    let server = Arc::new(serve(router(&db, layer.clone(), gate.clone())).await);
    let first = tokio::spawn({
        let server = Arc::clone(&server);
        async move { post(&server, "k", "hang", "card").await }
    });
    entered.recv().await.unwrap();
    let duplicate = tokio::spawn({
        let server = Arc::clone(&server);
        async move { post(&server, "k", "ok", "card").await }
    });
    until_waiting_on_locks(&db, 1).await;
    // The condition under test: a wait longer than the statement timeout.
    tokio::time::sleep(PAST_THE_TIMEOUT).await;
    gate.release.notify_one();
    let first = first.await.unwrap();
    assert_eq!(first.status, StatusCode::CREATED, "{}", first.text());
    let duplicate = duplicate.await.unwrap();
    assert_eq!(
        (duplicate.status, duplicate.header("idempotent-replayed")),
        (StatusCode::CREATED, Some("true")),
        "{}",
        duplicate.text()
    );
    assert_eq!(duplicate.body, first.body);
    assert_eq!((db.payments().await, db.records().await), (1, 1));
    let shown = serve(
        Router::new()
            .route("/show", routing::post(show))
            .layer(layer),
    )
    .await;
    let reply = shown
        .send_body("POST", "/show", &[("idempotency-key", "show")], "x")
        .await;
    assert_eq!(
        (reply.status, reply.text()),
        (StatusCode::CREATED, "300ms".to_owned()),
        "the handler's statements keep the application's statement_timeout"
    );
}

/// `migrate()` waiting on a concurrent migration (its advisory lock held past the timeout)
/// completes once that one commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_waits_past_a_shorter_statement_timeout_for_a_concurrent_migration() {
    let db = Db::new(
        &database("tx_statement_timeout", SETTINGS).await,
        "st_migrate",
    )
    .await;
    let mut holder = db.pool.begin().await.unwrap();
    sqlx::raw_sql(&format!(
        "SELECT pg_advisory_xact_lock(hashtext('tower-lock migrate {}.tower_lock_idempotency_records'))",
        db.schema
    ))
    .execute(&mut *holder)
    .await
    .unwrap();
    let builder = IdempotencyLayer::builder(LockEngine::in_memory())
        .unscoped()
        .transactional(db.pool.clone())
        .schema(&db.schema);
    // Spawned, as a service may run it: its future is `Send`.
    let migrating = tokio::spawn(async move { builder.migrate().await });
    while migrations_waiting(&db).await == 0 {
        tokio::task::yield_now().await;
    }
    tokio::time::sleep(PAST_THE_TIMEOUT).await;
    holder.commit().await.unwrap();
    let migrated = migrating.await.unwrap();
    migrated.expect("migrate() after waiting past the statement timeout");
}

/// How many backends wait for a lock in a migration of `db`'s schema.
async fn migrations_waiting(db: &Db) -> i64 {
    sqlx::query(
        "SELECT count(*) FROM pg_stat_activity
         WHERE wait_event_type = 'Lock' AND strpos(query, $1) > 0",
    )
    .persistent(false)
    .bind(format!("tower-lock migrate {}.", db.schema))
    .fetch_one(&db.pool)
    .await
    .unwrap()
    .get(0)
}
