//! Setting the layer up (a missing table is refused, naming the fix; a migration on tables
//! that exist logs no notice, and takes no lock a request in flight holds) and the
//! protocol through PgBouncer in transaction pooling mode.

use std::time::{Duration, Instant};

use http::StatusCode;
use tower_lock::{
    FenceTable, IdempotencyLayer, LockEngine,
    idempotency::transactional::SetupError,
    sqlx::{self, Row},
};
use tower_lock_test_support::{
    http::serve,
    postgres::{PgBouncer, PostgresServer},
};

use crate::{
    app::{Db, Gate, pool, post, router, shared_url},
    logs,
};

/// The server notices sqlx logged that name `db`'s schema.
fn notices_naming(db: &Db) -> Vec<String> {
    logs::events_with("target", logs::NOTICES)
        .into_iter()
        .filter_map(|event| event.get("message").cloned())
        .filter(|message| message.contains(&db.schema))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrating_tables_that_exist_logs_no_notice() {
    logs::capture();
    let db = Db::new(&shared_url().await, "quiet").await;
    // The schema exists (the payments table's): `CREATE SCHEMA IF NOT EXISTS` would say so.
    let _layer = db.layer(|b| b).await;
    IdempotencyLayer::builder(LockEngine::in_memory())
        .unscoped()
        .transactional(db.pool.clone())
        .schema(&db.schema)
        .migrate()
        .await
        .unwrap();
    FenceTable::new(&db.schema, "tower_lock_")
        .unwrap()
        .migrate(&db.pool)
        .await
        .unwrap();
    let notices = notices_naming(&db);
    assert!(notices.is_empty(), "{notices:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn build_refuses_a_missing_table_and_names_migrate() {
    let pool = pool(&shared_url().await).await;
    let refused = IdempotencyLayer::builder(LockEngine::in_memory())
        .unscoped()
        .transactional(pool)
        .schema("never_migrated")
        .build()
        .await
        .unwrap_err();
    assert!(
        matches!(refused, SetupError::MissingTable { .. }),
        "{refused:?}"
    );
    assert!(refused.to_string().contains("migrate()"), "{refused}");
}

/// Tables the version before made (the commit check there, the claim function that a
/// first request's `BEGIN` travels with not): `build()` refuses them naming `migrate()`,
/// which adds the function; then a first request runs once and its retry is replayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn build_refuses_tables_without_the_claim_sent_with_begin_and_migrate_adds_it() {
    let db = Db::new(&shared_url().await, "claim_ours").await;
    let _ = db.layer(|b| b).await;
    sqlx::raw_sql(&format!(
        "DROP FUNCTION {}.tower_lock_idempotency_claim_ours(
            text, bytea, double precision, text, boolean)",
        db.schema
    ))
    .execute(&db.pool)
    .await
    .unwrap();
    let builder = || {
        IdempotencyLayer::builder(LockEngine::in_memory())
            .unscoped()
            .transactional(db.pool.clone())
            .schema(&db.schema)
    };
    let refused = builder()
        .build()
        .await
        .expect_err("tables without the claim sent with BEGIN were accepted");
    assert!(
        matches!(refused, SetupError::Outdated { .. }) && refused.to_string().contains("migrate()"),
        "{refused}"
    );
    builder().migrate().await.unwrap();
    let (gate, _entered) = Gate::new();
    let server = serve(router(&db, builder().build().await.unwrap(), gate)).await;
    assert_eq!(
        post(&server, "k", "ok", "card").await.status,
        StatusCode::CREATED
    );
    let retry = post(&server, "k", "ok", "card").await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert_eq!(retry.header("idempotent-replayed"), Some("true"));
    assert_eq!(db.payments().await, 1);
}

/// Tables a version before the first request's lean statements made (the claim and
/// the completion as functions whose plans the server caches per connection): `build()`
/// refuses them naming `migrate()`, which adds both; then a first request runs once and
/// its retry is replayed. Nodes of that version keep their own claim on the same table
/// meanwhile (the same insert into the same unique index).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn build_refuses_tables_without_the_first_request_functions_and_migrate_adds_them() {
    for dropped in ["idempotency_claim_first", "idempotency_complete"] {
        let db = Db::new(&shared_url().await, "claim_first").await;
        let _ = db.layer(|b| b).await;
        let signature = if dropped == "idempotency_claim_first" {
            "text, bytea, double precision, text, boolean"
        } else {
            "text, bytea, bytea, double precision"
        };
        sqlx::raw_sql(&format!(
            "DROP FUNCTION {}.tower_lock_{dropped}({signature})",
            db.schema
        ))
        .execute(&db.pool)
        .await
        .unwrap();
        let builder = || {
            IdempotencyLayer::builder(LockEngine::in_memory())
                .unscoped()
                .transactional(db.pool.clone())
                .schema(&db.schema)
        };
        let refused = builder()
            .build()
            .await
            .expect_err("tables without the first request's functions were accepted");
        assert!(
            matches!(refused, SetupError::Outdated { .. })
                && refused.to_string().contains("migrate()"),
            "{dropped}: {refused}"
        );
        builder().migrate().await.unwrap();
        let (gate, _entered) = Gate::new();
        let server = serve(router(&db, builder().build().await.unwrap(), gate)).await;
        assert_eq!(
            post(&server, "k", "ok", "card").await.status,
            StatusCode::CREATED
        );
        let retry = post(&server, "k", "ok", "card").await;
        assert_eq!(retry.status, StatusCode::CREATED);
        assert_eq!(retry.header("idempotent-replayed"), Some("true"));
        assert_eq!(db.payments().await, 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn build_refuses_an_unscoped_decision_left_open() {
    let pool = pool(&shared_url().await).await;
    let refused = IdempotencyLayer::builder(LockEngine::in_memory())
        .transactional(pool)
        .build()
        .await
        .unwrap_err();
    assert!(matches!(refused, SetupError::Config(_)), "{refused:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_pgbouncer_in_transaction_mode_rows_commit_once_and_replay() {
    let bouncer = tokio::task::spawn_blocking(|| PgBouncer::start(PostgresServer::shared()))
        .await
        .unwrap();
    let db = Db::new(&bouncer.url(), "bouncer").await;
    let (gate, _entered) = Gate::new();
    let server = serve(router(&db, db.layer(|b| b).await, gate)).await;
    for round in 0..3 {
        let key = format!("k{round}");
        let headers = [("idempotency-key", key.as_str()), ("x-outcome", "invalid")];
        let invalid = server
            .send_body("POST", "/payments", &headers, "card")
            .await;
        assert_eq!(invalid.status, StatusCode::UNPROCESSABLE_ENTITY);
        let headers = [("idempotency-key", key.as_str()), ("x-outcome", "ok")];
        let first = server
            .send_body("POST", "/payments", &headers, "card")
            .await;
        assert_eq!(first.status, StatusCode::CREATED);
        let retry = server
            .send_body("POST", "/payments", &headers, "card")
            .await;
        assert_eq!(retry.header("idempotent-replayed"), Some("true"));
    }
    assert_eq!(db.payments().await, 3);
}

/// Whether a session waits for a lock on `db`'s records table.
async fn waiting_on_the_records(db: &Db) -> bool {
    sqlx::raw_sql(&format!(
        "SELECT EXISTS (SELECT FROM pg_locks WHERE NOT granted
            AND relation = to_regclass('{}.tower_lock_idempotency_records'))",
        db.schema
    ))
    .fetch_one(&db.pool)
    .await
    .unwrap()
    .get(0)
}

/// A `migrate()` while a handler holds its claim (uncommitted) takes no lock that waits for
/// it: it ends at once, and a new key's claim (which would queue behind a migration waiting
/// for a table lock, and under `wait(0)` be taken for a duplicate) is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrating_during_a_request_in_flight_waits_for_nothing() {
    let db = Db::new(&shared_url().await, "live_migrate").await;
    let (gate, mut entered) = Gate::new();
    let server = std::sync::Arc::new(serve(router(&db, db.layer(|b| b).await, gate.clone())).await);
    let held = tokio::spawn({
        let server = server.clone();
        async move { post(&server, "held", "hang", "card").await }
    });
    entered.recv().await.unwrap();
    for round in 0..3 {
        let started = Instant::now();
        let migrating = tokio::spawn({
            let pool = db.pool.clone();
            let schema = db.schema.clone();
            async move {
                IdempotencyLayer::builder(LockEngine::in_memory())
                    .unscoped()
                    .transactional(pool)
                    .schema(&schema)
                    .migrate()
                    .await
            }
        });
        // The migration is done, or waits on the records table (the defect): either way,
        // a fresh key's request now meets whatever it holds.
        while !migrating.is_finished() && !waiting_on_the_records(&db).await {}
        let fresh = post(&server, &format!("fresh {round}"), "ok", "card").await;
        assert_eq!(fresh.status, StatusCode::CREATED, "{:?}", fresh.body);
        let migrated = tokio::time::timeout(Duration::from_secs(2), migrating)
            .await
            .expect("migrate() waited for the request in flight");
        migrated.unwrap().unwrap();
        assert!(started.elapsed() < Duration::from_secs(2));
    }
    gate.release.notify_one();
    assert_eq!(held.await.unwrap().status, StatusCode::CREATED);
    assert_eq!(db.payments().await, 4);
}
