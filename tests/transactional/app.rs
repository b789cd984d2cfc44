//! The test application: a payments table in a schema of its own, the layer on it, and a
//! `POST /payments` handler that inserts one row through the borrowed transaction and
//! then answers as the request's `x-outcome` header says.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU32, Ordering},
    },
    time::Duration,
};

use axum::{
    Extension, Router,
    http::{HeaderMap, StatusCode},
    response::{IntoResponse, Response},
    routing,
};
use tokio::sync::{Notify, mpsc};
use tower_lock::{
    IdempotencyLayer, IdempotencyLayerBuilder, LockEngine,
    idempotency::transactional::TransactionalLayer,
    sqlx::{self, PgPool, Row, postgres::PgPoolOptions},
};
use tower_lock_axum::Tx;
use tower_lock_test_support::{
    http::{Reply, TestServer},
    postgres::PostgresServer,
};

/// The largest response stored by [`layer`]'s layers: `x-outcome: big` answers more.
pub(crate) const MAX_STORED: usize = 1024;

/// A schema of the test's own in the database at `url`, with its payments table.
#[derive(Clone, Debug)]
pub(crate) struct Db {
    pub(crate) schema: String,
    pub(crate) pool: PgPool,
}

/// The shared cluster's address.
pub(crate) async fn shared_url() -> String {
    tokio::task::spawn_blocking(|| PostgresServer::shared().url())
        .await
        .unwrap()
}

/// A pool on `url` whose statements are unnamed (so it also works behind PgBouncer).
pub(crate) async fn pool(url: &str) -> PgPool {
    PgPoolOptions::new()
        .max_connections(24)
        .acquire_timeout(Duration::from_secs(20))
        .connect(url)
        .await
        .unwrap()
}

impl Db {
    /// A fresh schema `name_<n>` on `url` with an empty payments table.
    pub(crate) async fn new(url: &str, name: &str) -> Self {
        static MADE: AtomicU32 = AtomicU32::new(0);
        let schema = format!(
            "{name}_{}_{}",
            std::process::id(),
            MADE.fetch_add(1, Ordering::Relaxed)
        );
        Self::existing(url, schema, true).await
    }

    /// The schema `schema` on `url`, its payments table created when `create`.
    pub(crate) async fn existing(url: &str, schema: String, create: bool) -> Self {
        let pool = pool(url).await;
        if create {
            sqlx::raw_sql(&format!(
                "CREATE SCHEMA {schema};
                 CREATE TABLE {schema}.payments (id bigserial PRIMARY KEY, note text NOT NULL)"
            ))
            .execute(&pool)
            .await
            .unwrap();
        }
        Self { schema, pool }
    }

    /// The rows of the payments table: what the handlers committed.
    pub(crate) async fn payments(&self) -> i64 {
        self.count("payments").await
    }

    /// The rows of the layer's records table.
    pub(crate) async fn records(&self) -> i64 {
        self.count("tower_lock_idempotency_records").await
    }

    async fn count(&self, table: &str) -> i64 {
        sqlx::raw_sql(&format!("SELECT count(*) FROM {}.{table}", self.schema))
            .fetch_one(&self.pool)
            .await
            .unwrap()
            .get(0)
    }

    /// A layer on this schema (migrated), unscoped, storing at most [`MAX_STORED`] bytes,
    /// as `configure` adjusts it.
    pub(crate) async fn layer(
        &self,
        configure: impl FnOnce(IdempotencyLayerBuilder) -> IdempotencyLayerBuilder,
    ) -> TransactionalLayer {
        let builder = IdempotencyLayer::builder(LockEngine::in_memory())
            .unscoped()
            .max_response_body(MAX_STORED);
        let builder = configure(builder)
            .transactional(self.pool.clone())
            .schema(&self.schema);
        builder.migrate().await.unwrap();
        builder.build().await.unwrap()
    }
}

/// What the handlers of one app report and wait for: `entered` gets a message once a
/// handler's row is inserted (uncommitted) or its lease taken (what it says depends on the
/// handler), and `x-outcome: hang` (or `x-pause`) handlers then wait for `release`.
#[derive(Clone, Debug)]
pub(crate) struct Gate {
    pub(crate) entered: mpsc::UnboundedSender<String>,
    pub(crate) release: Arc<Notify>,
}

impl Gate {
    pub(crate) fn new() -> (Self, mpsc::UnboundedReceiver<String>) {
        let (entered, rx) = mpsc::unbounded_channel();
        let gate = Self {
            entered,
            release: Arc::new(Notify::new()),
        };
        (gate, rx)
    }
}

/// The schema of the app's payments table, in the request extensions.
#[derive(Clone, Debug)]
pub(crate) struct Schema(pub(crate) String);

/// `POST /payments` on `db`'s payments table, under `layer`.
pub(crate) fn router(db: &Db, layer: TransactionalLayer, gate: Gate) -> Router {
    Router::new()
        .route("/payments", routing::post(pay))
        .layer(layer)
        .layer(Extension(Schema(db.schema.clone())))
        .layer(Extension(gate))
}

/// Inserts a payment with the body as its note, then answers as `x-outcome` says: `ok`
/// (default, `201` with the row's id), `invalid` (`422`), `fail` (`500`), `panic`,
/// `big` (`201` with a body over [`MAX_STORED`]), `hang` (waits for the gate, then `ok`),
/// `hang-panic` (waits for the gate, then panics).
pub(crate) async fn pay(
    Extension(Schema(schema)): Extension<Schema>,
    Extension(gate): Extension<Gate>,
    headers: HeaderMap,
    mut tx: Tx,
    body: String,
) -> Response {
    let outcome = headers
        .get("x-outcome")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("ok")
        .to_owned();
    let inserted = sqlx::query(&format!(
        "INSERT INTO {schema}.payments (note) VALUES ($1) RETURNING id"
    ))
    .persistent(false)
    .bind(body)
    .fetch_one(&mut *tx)
    .await;
    let id: i64 = match inserted {
        Ok(row) => row.get(0),
        Err(error) => return (StatusCode::SERVICE_UNAVAILABLE, error.to_string()).into_response(),
    };
    let _ = gate.entered.send(format!("payment {id}"));
    match outcome.as_str() {
        "invalid" => (StatusCode::UNPROCESSABLE_ENTITY, "invalid card").into_response(),
        "fail" => (StatusCode::INTERNAL_SERVER_ERROR, "bank down").into_response(),
        "panic" => panic!("the handler panicked after its insert"),
        "big" => (StatusCode::CREATED, "x".repeat(MAX_STORED * 4)).into_response(),
        "hang" => {
            gate.release.notified().await;
            (StatusCode::CREATED, format!("payment {id}")).into_response()
        }
        "hang-panic" => {
            gate.release.notified().await;
            panic!("the handler panicked after its client left")
        }
        _ => (StatusCode::CREATED, format!("payment {id}")).into_response(),
    }
}

/// `POST /payments` with idempotency key `key`, `x-outcome: outcome` and `body`.
pub(crate) async fn post(server: &TestServer, key: &str, outcome: &str, body: &str) -> Reply {
    server
        .send_body(
            "POST",
            "/payments",
            &[("idempotency-key", key), ("x-outcome", outcome)],
            body.to_owned(),
        )
        .await
}
