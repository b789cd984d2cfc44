//! Least privilege: `migrate()` run once by the schema's owner; the application connects
//! as a role with only the rights `docs/transactional.md` lists (`USAGE` on the schema;
//! `SELECT`, `INSERT`, `UPDATE`, `DELETE` on the records table; `SELECT`, `INSERT`,
//! `UPDATE` on the fences table; `EXECUTE` on the claim function, revoked here from
//! `PUBLIC`, which has it by default; nothing on the commit check's trigger function, which
//! the trigger runs without that right; no `CREATE`, no ownership). What it can affect:
//! every statement the layer sends, so every one runs under the role: `build()` (catalog
//! reads only), the claim, its wait ending in `409`, the replay, `422`, the record write
//! and the commit check (its refusal of a handler's `COMMIT` too), the fence check (raised
//! and refused), and the sweep; after a second `migrate()` (an upgrade), which keeps the
//! grants.

use std::{
    sync::{Arc, OnceLock},
    time::Duration,
};

use axum::{
    Extension, Router,
    http::{HeaderMap, StatusCode},
    response::{IntoResponse, Response},
    routing,
};
use tower_lock::{
    IdempotencyLayer, LockEngine, LockLayer,
    key::HeaderKey,
    sqlx::{self, Executor},
};
use tower_lock_axum::{Locked, Tx};
use tower_lock_test_support::{
    http::{Reply, TestServer, serve},
    postgres::{PostgresServer, TEST_USER},
};

use crate::app::{Db, Gate, shared_url};

/// The application's role.
const APP: &str = "tx_app";

/// The rights the docs list for the layer's tables in `schema` (default prefix), and the
/// application's own on its payments table.
fn grants(schema: &str) -> String {
    format!(
        "GRANT USAGE ON SCHEMA {schema} TO {APP};
         GRANT SELECT, INSERT, UPDATE, DELETE ON {schema}.tower_lock_idempotency_records TO {APP};
         GRANT SELECT, INSERT, UPDATE ON {schema}.tower_lock_fences TO {APP};
         REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA {schema} FROM PUBLIC;
         GRANT EXECUTE ON FUNCTION {schema}.tower_lock_idempotency_claim(
             text, bytea, double precision, text, boolean) TO {APP};
         GRANT EXECUTE ON FUNCTION {schema}.tower_lock_idempotency_claim_ours(
             text, bytea, double precision, text, boolean) TO {APP};
         GRANT EXECUTE ON FUNCTION {schema}.tower_lock_idempotency_claim_first(
             text, bytea, double precision, text, boolean) TO {APP};
         GRANT EXECUTE ON FUNCTION {schema}.tower_lock_idempotency_complete(
             text, bytea, bytea, double precision) TO {APP};
         GRANT SELECT, INSERT ON {schema}.payments TO {APP};
         GRANT USAGE ON SEQUENCE {schema}.payments_id_seq TO {APP};"
    )
}

/// The application's URL on the shared cluster (the role made on first use, no rights).
async fn app_url() -> String {
    static APP_URL: OnceLock<String> = OnceLock::new();
    let owner = shared_url().await;
    tokio::task::spawn_blocking(move || {
        APP_URL
            .get_or_init(|| {
                PostgresServer::shared().psql(&format!("CREATE ROLE {APP} LOGIN"));
                owner.replacen(&format!("//{TEST_USER}@"), &format!("//{APP}@"), 1)
            })
            .clone()
    })
    .await
    .unwrap()
}

/// Inserts a payment noted with the body, checks the lease's fence, then as `x-outcome`
/// says: `hang` (waits for the gate), `commit` (a `COMMIT` on the lent connection), else
/// nothing; `201`.
async fn pay(
    Extension(schema): Extension<String>,
    Extension(gate): Extension<Gate>,
    Locked(lease): Locked,
    headers: HeaderMap,
    mut tx: Tx,
    body: String,
) -> Response {
    sqlx::query(&format!("INSERT INTO {schema}.payments (note) VALUES ($1)"))
        .persistent(false)
        .bind(&body)
        .execute(&mut *tx)
        .await
        .unwrap();
    if let Err(refused) = tx.check_fence(&lease).await {
        return refused.into_response();
    }
    match headers.get("x-outcome").map(|v| v.to_str().unwrap()) {
        Some("hang") => {
            gate.entered.send(body.clone()).unwrap();
            gate.release.notified().await;
        }
        Some("commit") => {
            let _ = (&mut *tx).execute(sqlx::raw_sql("COMMIT")).await;
        }
        _ => {}
    }
    (StatusCode::CREATED, format!("paid {body}")).into_response()
}

async fn send(server: &TestServer, key: &str, tenant: &str, outcome: &str, body: &str) -> Reply {
    let headers = [
        ("idempotency-key", key),
        ("x-tenant", tenant),
        ("x-outcome", outcome),
    ];
    tokio::time::timeout(
        Duration::from_secs(10),
        server.send_body("POST", "/payments", &headers, body.to_owned()),
    )
    .await
    .expect("an answer within 10 s")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_application_role_with_the_documented_rights_runs_every_statement_of_the_layer() {
    let owner = Db::new(&shared_url().await, "least").await;
    let schema = owner.schema.clone();
    let builder = |pool| {
        IdempotencyLayer::builder(LockEngine::in_memory())
            .unscoped()
            .wait(Duration::from_millis(300))
            .transactional(pool)
            .schema(&schema)
    };
    builder(owner.pool.clone()).migrate().await.unwrap();
    let app_url = app_url().await;
    owner
        .pool
        .execute(sqlx::raw_sql(&grants(&schema)))
        .await
        .unwrap();
    // Run again, as an upgrade does: the claim function is replaced, its grants kept.
    builder(owner.pool.clone()).migrate().await.unwrap();
    let app = Db::existing(&app_url, schema.clone(), false).await;
    let layer = builder(app.pool.clone())
        .build()
        .await
        .expect("build() as the application's role");
    let created = app
        .pool
        .execute(sqlx::raw_sql(&format!(
            "CREATE TABLE {schema}.intruder (x int)"
        )))
        .await;
    assert!(created.is_err(), "the application's role cannot create");
    let lock = LockLayer::builder(LockEngine::in_memory())
        .key(HeaderKey::new("x-tenant"))
        .build()
        .unwrap();
    let (gate, mut entered) = Gate::new();
    let server = Arc::new(
        serve(
            Router::new()
                .route("/payments", routing::post(pay))
                .layer(layer.clone())
                .layer(lock)
                .layer(Extension(schema.clone()))
                .layer(Extension(gate.clone())),
        )
        .await,
    );

    // The claim, the fence raised, the record write and its commit check; the replay; 422.
    let first = send(&server, "k1", "t", "ok", "card").await;
    assert_eq!(first.status, StatusCode::CREATED, "{}", first.text());
    let replay = send(&server, "k1", "t", "ok", "card").await;
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    let other = send(&server, "k1", "t", "ok", "other card").await;
    assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY);

    // A duplicate (another tenant's lock) waits out the claim's lock_timeout: 409.
    let hanging = tokio::spawn({
        let server = Arc::clone(&server);
        async move { send(&server, "k2", "a", "hang", "card").await }
    });
    entered.recv().await.unwrap();
    let duplicate = send(&server, "k2", "b", "ok", "card").await;
    assert_eq!(
        duplicate.status,
        StatusCode::CONFLICT,
        "{}",
        duplicate.text()
    );
    gate.release.notify_one();
    assert_eq!(hanging.await.unwrap().status, StatusCode::CREATED);

    // A handler's COMMIT is refused by the commit check: 500, nothing stored; the retry runs.
    let committed = send(&server, "k3", "t", "commit", "card").await;
    assert_eq!(
        committed.status,
        StatusCode::INTERNAL_SERVER_ERROR,
        "{}",
        committed.text()
    );
    let retried = send(&server, "k3", "t", "ok", "card").await;
    assert_eq!(
        (retried.status, retried.header("idempotent-replayed")),
        (StatusCode::CREATED, None),
        "{}",
        retried.text()
    );

    // The fence check refuses a stale holder (a newer one wrote a higher mark).
    sqlx::raw_sql(&format!(
        "UPDATE {schema}.tower_lock_fences SET fence = 9000000000000000000"
    ))
    .execute(&owner.pool)
    .await
    .unwrap();
    let stale = send(&server, "k4", "t", "ok", "card").await;
    assert_eq!(stale.status, StatusCode::CONFLICT, "{}", stale.text());
    assert!(stale.text().contains("stale-fence"), "{}", stale.text());

    // The sweep deletes an expired record.
    sqlx::raw_sql(&format!(
        "UPDATE {schema}.tower_lock_idempotency_records SET expires_at = now() - interval '1s'
         WHERE key LIKE '%k1'"
    ))
    .execute(&owner.pool)
    .await
    .unwrap();
    assert_eq!(
        layer
            .sweep()
            .await
            .expect("the sweep as the application's role"),
        1
    );
    assert_eq!(layer.failed_sweeps(), 0);
    assert_eq!((owner.payments().await, owner.records().await), (3, 2));
}
