//! Names a user picks: a schema and a table prefix that are SQL reserved words are quoted
//! identifiers in every statement of the layer (the migration, the claim function, the
//! record write, the fence check, the sweep); capitals are refused at once, by name, as
//! the Postgres lock engine refuses them.

use std::time::Duration;

use axum::{
    Extension, Router,
    http::StatusCode,
    response::{IntoResponse, Response},
    routing,
};
use tower_lock::{
    IdempotencyLayer, LockEngine, LockLayer,
    idempotency::transactional::SetupError,
    key::HeaderKey,
    sqlx::{self, Row},
};
use tower_lock_axum::{Locked, Tx};
use tower_lock_test_support::http::serve;

use crate::app::{Db, post, shared_url};

/// Inserts a payment into the business schema (a plain name) and checks the lease's fence
/// (the layer's fences table, in the reserved-word schema), in the request's transaction.
async fn fenced_pay(
    Extension(schema): Extension<String>,
    Locked(lease): Locked,
    mut tx: Tx,
    body: String,
) -> Response {
    let id: i64 = sqlx::query(&format!(
        "INSERT INTO {schema}.payments (note) VALUES ($1) RETURNING id"
    ))
    .persistent(false)
    .bind(body)
    .fetch_one(&mut *tx)
    .await
    .unwrap()
    .get(0);
    if let Err(refused) = tx.check_fence(&lease).await {
        return refused.into_response();
    }
    (StatusCode::CREATED, format!("payment {id}")).into_response()
}

/// The rows of `table` (quoted, qualified) as the test's pool sees them.
async fn rows(db: &Db, table: &str) -> i64 {
    sqlx::raw_sql(&format!("SELECT count(*) FROM {table}"))
        .fetch_one(&db.pool)
        .await
        .unwrap()
        .get(0)
}

/// For schema `order` (default prefix) and schema `user` with prefix `select` (tables
/// `selectidempotency_records`, `selectfences`), under a waiting layer and one that does
/// not wait (the claim function's advisory-lock branch): migrate (twice: idempotent),
/// build, a first request that checks its fence, its replay, a `422`, a sweep; one payment
/// row, one record and one fence row per layer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reserved_words_as_schema_and_prefix_migrate_claim_fence_and_replay() {
    let db = Db::new(&shared_url().await, "reserved").await;
    let lock = LockLayer::builder(LockEngine::in_memory())
        .key(HeaderKey::new("idempotency-key"))
        .build()
        .unwrap();
    let cases = [
        ("order", "tower_lock_", Duration::from_secs(5)),
        ("user", "select", Duration::ZERO),
    ];
    for (round, (schema, prefix, wait)) in cases.into_iter().enumerate() {
        let builder = IdempotencyLayer::builder(LockEngine::in_memory())
            .unscoped()
            .wait(wait)
            .transactional(db.pool.clone())
            .schema(schema)
            .prefix(prefix);
        builder.migrate().await.unwrap();
        builder.migrate().await.unwrap();
        let layer = builder.build().await.unwrap();
        let app = Router::new()
            .route("/payments", routing::post(fenced_pay))
            .layer(layer.clone())
            .layer(lock.clone())
            .layer(Extension(db.schema.clone()));
        let server = serve(app).await;
        let key = format!("k{round}");
        let first = post(&server, &key, "ok", "card").await;
        assert_eq!(
            first.status,
            StatusCode::CREATED,
            "{schema}: {}",
            first.text()
        );
        let retry = post(&server, &key, "ok", "card").await;
        assert_eq!(
            retry.header("idempotent-replayed"),
            Some("true"),
            "{schema}"
        );
        assert_eq!(retry.body, first.body);
        let other = post(&server, &key, "ok", "another card").await;
        assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY, "{schema}");
        layer.sweep().await.unwrap();
        let records = format!("\"{schema}\".\"{prefix}idempotency_records\"");
        let fences = format!("\"{schema}\".\"{prefix}fences\"");
        assert_eq!(
            (rows(&db, &records).await, rows(&db, &fences).await),
            (1, 1)
        );
    }
    assert_eq!(db.payments().await, 2);
}

/// A schema or prefix with capitals is refused by `migrate()` and `build()` before any
/// SQL, by a `SetupError::Name` that states the rule (the lock engine's: a-z, 0-9, `_`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capitals_in_a_schema_or_prefix_are_refused_naming_the_rule() {
    let pool = crate::app::pool(&shared_url().await).await;
    for (schema, prefix) in [("Order", "tower_lock_"), ("public", "Select_")] {
        let builder = || {
            IdempotencyLayer::builder(LockEngine::in_memory())
                .unscoped()
                .transactional(pool.clone())
                .schema(schema)
                .prefix(prefix)
        };
        let migrated = builder().migrate().await.unwrap_err();
        let built = builder().build().await.unwrap_err();
        for refused in [migrated, built] {
            assert!(matches!(refused, SetupError::Name(_)), "{refused:?}");
            let text = refused.to_string();
            assert!(text.contains("a-z, 0-9 and _"), "{text}");
        }
    }
}
