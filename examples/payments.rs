//! Exactly once for database writes: an axum payments service on Postgres whose
//! `POST /payments` inserts a payment row, and an outbox row for its receipt email, through
//! the transaction the idempotency layer commits with its record (`tower_lock_axum::Tx`).
//!
//! ```sh
//! DATABASE_URL=postgres://localhost/payments cargo run --example payments --features postgres
//! ```
//!
//! - A retry with the same `Idempotency-Key` is replayed (`Idempotent-Replayed: true`); the
//!   same key with another body is `422`; a validation error (`amount` not a positive
//!   number) is `422` and rolls back, so the corrected retry runs.
//! - `X-Demo-Pause: 30` makes the handler wait 30 s after its insert: kill the process
//!   (`kill -9`) meanwhile, start it again, retry, and `GET /payments` shows one row.
//! - The email is not sent in the handler (it is outside the transaction): a worker sends
//!   the outbox rows once they are committed (here it only prints them).
//!
//! `docs/transactional.md` has the curl session.

use std::{env, error::Error, time::Duration};

use axum::{
    Extension, Router,
    http::{HeaderMap, StatusCode},
    response::{IntoResponse, Response},
    routing::{get, post},
};
use tokio::net::TcpListener;
use tower_lock::{
    IdempotencyLayer, LockEngine,
    sqlx::{self, PgPool, Row, postgres::PgPoolOptions},
};
use tower_lock_axum::Tx;

const SCHEMA: &str = "
    CREATE TABLE IF NOT EXISTS payments (
        id bigserial PRIMARY KEY, amount bigint NOT NULL, created_at timestamptz DEFAULT now());
    CREATE TABLE IF NOT EXISTS payment_emails (
        id bigserial PRIMARY KEY, payment_id bigint NOT NULL, sent boolean NOT NULL DEFAULT false);";

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let url = env::var("DATABASE_URL").map_err(|_| "set DATABASE_URL=postgres://…")?;
    // Unnamed statements and a connection per request's transaction: it also works behind
    // PgBouncer in transaction mode.
    let pool = PgPoolOptions::new()
        .max_connections(16)
        .connect(&url)
        .await?;
    sqlx::raw_sql(SCHEMA).execute(&pool).await?;
    // The engine derives the keys only: the records table's unique index orders duplicates.
    let builder = IdempotencyLayer::builder(LockEngine::in_memory())
        .unscoped() // a demo without accounts; a real service scopes per principal
        .wait(Duration::from_secs(10))
        .transactional(pool.clone());
    builder.migrate().await?;
    let layer = builder.build().await?;
    tokio::spawn(send_receipts(pool.clone()));
    let app = Router::new()
        .route("/payments", post(pay).layer(layer))
        .route("/payments", get(count))
        .layer(Extension(pool));
    let port = env::var("PORT").unwrap_or_else(|_| "3000".to_owned());
    let listener = TcpListener::bind(format!("127.0.0.1:{port}")).await?;
    println!("payments on http://127.0.0.1:{port}; docs/transactional.md has a curl session");
    axum::serve(listener, app).await?;
    Ok(())
}

/// `POST /payments` with the amount in cents as the body.
async fn pay(headers: HeaderMap, mut tx: Tx, body: String) -> Response {
    let Ok(amount) = body.trim().parse::<i64>() else {
        return (
            StatusCode::UNPROCESSABLE_ENTITY,
            "amount: a positive number of cents\n",
        )
            .into_response();
    };
    if amount <= 0 {
        return (
            StatusCode::UNPROCESSABLE_ENTITY,
            "amount: a positive number of cents\n",
        )
            .into_response();
    }
    let inserted = sqlx::query("INSERT INTO payments (amount) VALUES ($1) RETURNING id")
        .persistent(false)
        .bind(amount)
        .fetch_one(&mut *tx)
        .await;
    let id: i64 = match inserted {
        Ok(row) => row.get(0),
        Err(e) => return (StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")).into_response(),
    };
    // The outbox: the email is a row in the same transaction, sent after the commit.
    let queued = sqlx::query("INSERT INTO payment_emails (payment_id) VALUES ($1)")
        .persistent(false)
        .bind(id)
        .execute(&mut *tx)
        .await;
    if let Err(e) = queued {
        return (StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")).into_response();
    }
    let pause = headers
        .get("x-demo-pause")
        .and_then(|v| v.to_str().ok()?.parse().ok());
    if let Some(seconds) = pause {
        println!(
            "payment {id} inserted, not committed; kill me now (pid {})",
            std::process::id()
        );
        tokio::time::sleep(Duration::from_secs(seconds)).await;
    }
    (
        StatusCode::CREATED,
        format!("payment {id}: {amount} cents\n"),
    )
        .into_response()
}

/// `GET /payments`: how many payments are committed.
async fn count(Extension(pool): Extension<PgPool>) -> Response {
    match sqlx::raw_sql("SELECT count(*) FROM payments")
        .fetch_one(&pool)
        .await
    {
        Ok(row) => format!("{} payments\n", row.get::<i64, _>(0)).into_response(),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")).into_response(),
    }
}

/// The outbox worker: sends what committed, once (here: prints it).
async fn send_receipts(pool: PgPool) {
    loop {
        let sent = sqlx::raw_sql(
            "UPDATE payment_emails SET sent = true WHERE id IN (
                SELECT id FROM payment_emails WHERE NOT sent LIMIT 100 FOR UPDATE SKIP LOCKED)
             RETURNING payment_id",
        )
        .fetch_all(&pool)
        .await;
        for row in sent.unwrap_or_default() {
            println!("receipt for payment {} sent", row.get::<i64, _>(0));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
