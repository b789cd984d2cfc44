//! The fence check in the request's transaction: a holder paused past its lease (a server
//! process SIGSTOPped in its handler, so nothing renews the lease) has its writes refused
//! once a newer holder took the lock and wrote; under the transactional layer (`Tx`), and
//! under a plain `LockLayer` whose handler checks in a transaction of its own
//! (`FenceTable`).

use std::time::Duration;

use axum::{
    Extension, Router,
    http::{HeaderMap, StatusCode},
    response::{IntoResponse, Response},
    routing::post,
};
use tower_lock::{
    FenceError, FenceTable, LockEngine, LockLayer,
    engine::postgres::PostgresBackend,
    key::HeaderKey,
    sqlx::{self, PgPool, Row},
};
use tower_lock_axum::{Locked, Tx};
use tower_lock_test_support::{
    http::serve,
    postgres::{PgBouncer, PostgresServer},
};

use crate::{
    app::{Db, Gate, shared_url},
    child::{ChildApp, ChildServer, mark, request, send, until_written},
};

/// The lease length of [`fenced_app`]'s lock: short, so that a paused holder loses it.
const TTL: Duration = Duration::from_secs(2);

/// The Postgres lock engine on `url`, listening on `listen` (a direct URL: a transaction
/// pooler cannot carry `LISTEN`), its tables in schema `<db's schema>_locks` (migrated).
pub(crate) async fn lock_engine(url: &str, listen: &str, db: &Db) -> LockEngine {
    let builder = PostgresBackend::builder(url)
        .listen_url(listen)
        .schema(format!("{}_locks", db.schema));
    builder.migrate().await.unwrap();
    LockEngine::new(builder.build().await.unwrap())
}

/// `POST /payments` under a per-tenant (`x-tenant`) lock of `engine` with a [`TTL`] lease,
/// then the transactional layer on `db`: [`fenced_pay`].
pub(crate) async fn fenced_app(db: &Db, engine: LockEngine, gate: Gate) -> Router {
    let lock = LockLayer::builder(engine)
        .key(HeaderKey::new("x-tenant"))
        .ttl(TTL)
        .wait(Duration::from_secs(20))
        .build()
        .unwrap();
    Router::new()
        .route("/payments", post(fenced_pay))
        .layer(db.layer(|b| b).await)
        .layer(lock)
        .layer(Extension(db.schema.clone()))
        .layer(Extension(gate))
}

/// `POST /payments` under the same per-tenant lock, without the transactional layer:
/// [`plain_fenced_pay`], its fences in `db`'s schema (migrated).
pub(crate) async fn plain_fenced_app(db: &Db, engine: LockEngine, gate: Gate) -> Router {
    let lock = LockLayer::builder(engine)
        .key(HeaderKey::new("x-tenant"))
        .ttl(TTL)
        .wait(Duration::from_secs(20))
        .build()
        .unwrap();
    let fences = FenceTable::new(&db.schema, "tower_lock_").unwrap();
    fences.migrate(&db.pool).await.unwrap();
    Router::new()
        .route("/payments", post(plain_fenced_pay))
        .layer(lock)
        .layer(Extension(db.schema.clone()))
        .layer(Extension(db.pool.clone()))
        .layer(Extension(fences))
        .layer(Extension(gate))
}

/// As [`fenced_pay`], in a transaction of the handler's own, checked by a [`FenceTable`]: a
/// stale holder is answered `409 stale-fence` and its transaction rolls back (dropped).
async fn plain_fenced_pay(
    Extension(gate): Extension<Gate>,
    Extension(schema): Extension<String>,
    Extension(pool): Extension<PgPool>,
    Extension(fences): Extension<FenceTable>,
    Locked(lease): Locked,
    headers: HeaderMap,
) -> Response {
    if headers.contains_key("x-pause") {
        gate.entered.send(lease.key().as_str().to_owned()).unwrap();
        gate.release.notified().await;
    }
    let note = headers["idempotency-key"].to_str().unwrap().to_owned();
    let mut tx = pool.begin().await.unwrap();
    sqlx::query(&format!("INSERT INTO {schema}.payments (note) VALUES ($1)"))
        .persistent(false)
        .bind(note)
        .execute(&mut *tx)
        .await
        .unwrap();
    match fences.check(&mut tx, &lease).await {
        Ok(()) => {
            tx.commit().await.unwrap();
            StatusCode::CREATED.into_response()
        }
        Err(FenceError::Stale { .. }) => (StatusCode::CONFLICT, "stale-fence").into_response(),
        Err(error) => (StatusCode::SERVICE_UNAVAILABLE, error.to_string()).into_response(),
    }
}

/// A request marked `x-pause` reports its lease's key and waits for the gate; then every
/// request inserts a payment noted with its idempotency key and checks its lease's fence in
/// the same transaction.
async fn fenced_pay(
    Extension(gate): Extension<Gate>,
    Extension(schema): Extension<String>,
    Locked(lease): Locked,
    headers: HeaderMap,
    mut tx: Tx,
) -> Response {
    if headers.contains_key("x-pause") {
        gate.entered.send(lease.key().as_str().to_owned()).unwrap();
        gate.release.notified().await;
    }
    let note = headers["idempotency-key"].to_str().unwrap().to_owned();
    sqlx::query(&format!("INSERT INTO {schema}.payments (note) VALUES ($1)"))
        .persistent(false)
        .bind(note)
        .execute(&mut *tx)
        .await
        .unwrap();
    if let Err(refused) = tx.check_fence(&lease).await {
        return refused.into_response();
    }
    StatusCode::CREATED.into_response()
}

/// Every connection of the test, its servers and the lock engines through `url` (but the
/// engines' listeners).
async fn a_paused_holders_writes_are_refused_after_a_newer_holder_wrote(url: &str, name: &str) {
    paused_holder(url, name, ChildApp::Fenced).await;
}

/// The paused holder's writes refused, under `app` ([`ChildApp::Fenced`] or
/// [`ChildApp::PlainFenced`]).
async fn paused_holder(url: &str, name: &str, app: ChildApp) {
    let plain = matches!(app, ChildApp::PlainFenced);
    let db = Db::new(url, name).await;
    let engine = lock_engine(url, &shared_url().await, &db).await;
    // The newer holder's server, made before the first transaction opens (its migration
    // would wait for that transaction's lock on the records table).
    let (gate, _entered) = Gate::new();
    let newer = if plain {
        plain_fenced_app(&db, engine.clone(), gate).await
    } else {
        fenced_app(&db, engine.clone(), gate).await
    };
    let newer = serve(newer).await;
    let mark = mark(name);
    let paused = ChildServer::start(app, url, &db, &mark).await;
    let headers = [
        ("idempotency-key", "stale"),
        ("x-tenant", "t1"),
        ("x-pause", "1"),
    ];
    let stale = tokio::spawn({
        let request = request("/payments", &headers, "card");
        let port = paused.port();
        async move { send(port, &request).await }
    });
    let entered = mark.with_extension("entered");
    until_written(&entered).await;
    let key = std::fs::read_to_string(&entered).unwrap();
    // The holder's process stops in its handler, renewal and all: its lease runs out,
    // as the lock tables say.
    paused.signal("STOP");
    let deadline = tokio::time::Instant::now() + TTL * 10;
    while engine.lock(&key).locked().await.unwrap() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the lease never ran out"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let headers = [("idempotency-key", "newer"), ("x-tenant", "t1")];
    let newer = newer.send_body("POST", "/payments", &headers, "card").await;
    assert_eq!(newer.status, StatusCode::CREATED, "{}", newer.text());
    paused.signal("CONT");
    paused.release().await;
    let stale = stale.await.unwrap();
    assert_eq!(stale.status, StatusCode::CONFLICT, "{stale:#?}");
    assert!(stale.body.contains("stale-fence"), "{stale:#?}");
    // The newer holder's row alone: the stale insert rolled back with its record.
    let notes: Vec<String> = sqlx::raw_sql(&format!("SELECT note FROM {}.payments", db.schema))
        .fetch_all(&db.pool)
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(notes, ["newer"]);
    if !plain {
        assert_eq!(db.records().await, 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_a_plain_lock_layer_a_paused_holders_writes_are_refused_by_the_fence_table() {
    paused_holder(&shared_url().await, "pfence", ChildApp::PlainFenced).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_paused_past_its_lease_has_its_writes_refused_after_a_newer_holder_wrote() {
    a_paused_holders_writes_are_refused_after_a_newer_holder_wrote(&shared_url().await, "fence")
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_pgbouncer_a_paused_holders_writes_are_refused_after_a_newer_holder_wrote() {
    let bouncer = tokio::task::spawn_blocking(|| PgBouncer::start(PostgresServer::shared()))
        .await
        .unwrap();
    a_paused_holders_writes_are_refused_after_a_newer_holder_wrote(&bouncer.url(), "fence_pgb")
        .await;
}

/// Eight nodes migrating the fences table of a fresh schema at once, a few rounds (and the
/// layer's migration among them): all succeed, none meets the catalog's race (`23505` on
/// `pg_namespace` or `pg_type` between two `CREATE ... IF NOT EXISTS`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_fence_table_migrations_of_a_fresh_schema_all_succeed() {
    let pool = crate::app::pool(&shared_url().await).await;
    for round in 0..4 {
        let schema = format!("fence_race_{}_{round}", std::process::id());
        let migrations: Vec<_> = (0..8)
            .map(|node| {
                let pool = pool.clone();
                let schema = schema.clone();
                async move {
                    if node == 0 {
                        tower_lock::IdempotencyLayer::builder(LockEngine::in_memory())
                            .unscoped()
                            .transactional(pool)
                            .schema(&schema)
                            .migrate()
                            .await
                            .map_err(|e| e.to_string())
                    } else {
                        FenceTable::new(&schema, "tower_lock_")
                            .unwrap()
                            .migrate(&pool)
                            .await
                            .map_err(|e| e.to_string())
                    }
                }
            })
            .collect();
        for migrated in futures_util::future::join_all(migrations).await {
            migrated.unwrap();
        }
    }
}

/// Under `dry_run(true)` the lease guards nothing (its fence may be `0`, the lease of a
/// request the layer would have refused): `FenceTable::check` is `Ok` without touching
/// the table, so a dry run never changes an answer, even against a newer mark.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_a_dry_run_the_fence_check_passes_and_writes_nothing() {
    let db = Db::new(&shared_url().await, "dry_fence").await;
    let fences = FenceTable::new(&db.schema, "tower_lock_").unwrap();
    fences.migrate(&db.pool).await.unwrap();
    let layer = LockLayer::builder(LockEngine::in_memory())
        .key(HeaderKey::new("x-tenant"))
        .dry_run(true)
        .build()
        .unwrap();
    async fn checked(
        Extension(pool): Extension<PgPool>,
        Extension(fences): Extension<FenceTable>,
        Locked(lease): Locked,
    ) -> Response {
        let mut tx = pool.begin().await.unwrap();
        // A newer holder's mark, far above any fence.
        sqlx::query(&format!(
            "INSERT INTO {} (key, fence) VALUES ($1, 9000000000000000000)",
            fences.name()
        ))
        .persistent(false)
        .bind(lease.key().as_str())
        .execute(&mut *tx)
        .await
        .unwrap();
        let answer = match fences.check(&mut tx, &lease).await {
            Ok(()) => StatusCode::OK,
            Err(FenceError::Stale { .. }) => StatusCode::CONFLICT,
            Err(other) => panic!("{other}"),
        };
        tx.rollback().await.unwrap();
        answer.into_response()
    }
    let app = Router::new()
        .route("/check", post(checked))
        .layer(layer)
        .layer(Extension(fences.clone()))
        .layer(Extension(db.pool.clone()));
    let server = serve(app).await;
    let reply = server
        .send_body("POST", "/check", &[("x-tenant", "t1")], "")
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let marks: i64 = sqlx::raw_sql(&format!("SELECT count(*) FROM {}", fences.name()))
        .fetch_one(&db.pool)
        .await
        .unwrap()
        .get(0);
    assert_eq!(marks, 0);
}
