//! The transactional idempotency layer's bench, on a Postgres cluster of its own (the
//! test fixture: `initdb` as the `postgres` user, `fsync` off): an idempotent `POST` that
//! inserts one row, through the layer ÷ the same handler inserting in its own transaction
//! without the layer, same run, 16 concurrent clients (goal ≥ 0.7; the median of alternating
//! rounds, `--rounds` of `--duration-secs` each, default 3 of 5 s); and a replay's rate.
//! Prints one JSON object per figure.
//!
//! ```sh
//! cargo bench --features postgres --bench transactional -- --json
//! ```

mod support;

use std::{
    net::SocketAddr,
    process::ExitCode,
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, Instant},
};

use axum::{Extension, Router, http::StatusCode, routing::post};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, header::HOST};
use hyper_util::rt::TokioIo;
use serde_json::json;
use support::{Args, round};
use tokio::net::TcpStream;
use tower_lock::{
    IdempotencyLayer, LockEngine,
    sqlx::{self, PgPool, postgres::PgPoolOptions},
};
use tower_lock_axum::Tx;
use tower_lock_test_support::postgres::PostgresServer;

const CLIENTS: usize = 16;
const INSERT: &str = "INSERT INTO payments (note) VALUES ($1)";

/// The handler through the layer: the insert in the borrowed transaction.
async fn through_layer(mut tx: Tx, body: String) -> StatusCode {
    match sqlx::query(INSERT)
        .persistent(false)
        .bind(body)
        .execute(&mut *tx)
        .await
    {
        Ok(_) => StatusCode::CREATED,
        Err(_) => StatusCode::SERVICE_UNAVAILABLE,
    }
}

/// The same handler without the layer: the insert in a transaction of its own.
async fn own_transaction(Extension(pool): Extension<PgPool>, body: String) -> StatusCode {
    let inserted = async {
        let mut tx = pool.begin().await?;
        sqlx::query(INSERT)
            .persistent(false)
            .bind(body)
            .execute(&mut *tx)
            .await?;
        tx.commit().await
    };
    match inserted.await {
        Ok(()) => StatusCode::CREATED,
        Err(_) => StatusCode::SERVICE_UNAVAILABLE,
    }
}

async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

/// Requests per second and non-`201` answers, `CLIENTS` keep-alive connections sending
/// `POST /payments` for `duration`; `key(n)` is the idempotency key of the n-th request.
async fn rate(addr: SocketAddr, duration: Duration, fresh_keys: bool) -> (f64, u64) {
    if !fresh_keys {
        // The first request runs the handler (its duplicates would be `409`); every later
        // one is a replay.
        rate_of(addr, Duration::ZERO, false, 1).await;
    }
    rate_of(addr, duration, fresh_keys, CLIENTS).await
}

async fn rate_of(
    addr: SocketAddr,
    duration: Duration,
    fresh_keys: bool,
    clients: usize,
) -> (f64, u64) {
    // Keys unique across the whole run: a key of an earlier round would be a replay.
    static SEQUENCE: AtomicU64 = AtomicU64::new(0);
    let until = Instant::now() + duration;
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            tokio::spawn(async move {
                let stream = TcpStream::connect(addr).await.unwrap();
                stream.set_nodelay(true).unwrap();
                let (mut s, driver) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                    .await
                    .unwrap();
                tokio::spawn(driver);
                let (mut done, mut bad) = (0u64, 0u64);
                // At least one request (the replay's first).
                while done == 0 || Instant::now() < until {
                    let n = SEQUENCE.fetch_add(1, Ordering::Relaxed);
                    let key = if fresh_keys {
                        format!("k{n}")
                    } else {
                        "replayed".to_owned()
                    };
                    let req = Request::post("/payments")
                        .header(HOST, "localhost")
                        .header("idempotency-key", key)
                        .body(Full::new(Bytes::from_static(b"card")))
                        .unwrap();
                    s.ready().await.unwrap();
                    let res = s.send_request(req).await.unwrap();
                    let status = res.status();
                    let body = res.into_body().collect().await.unwrap().to_bytes();
                    if status != StatusCode::CREATED {
                        bad += 1;
                        eprintln!("{status}: {}", String::from_utf8_lossy(&body));
                    }
                    done += 1;
                }
                (done, bad)
            })
        })
        .collect();
    let (mut done, mut bad) = (0, 0);
    for t in tasks {
        let (d, b) = t.await.unwrap();
        done += d;
        bad += b;
    }
    (done as f64 / duration.as_secs_f64().max(1e-9), bad)
}

/// The median of `values` (the upper one of an even count).
fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}

fn main() -> ExitCode {
    let args = match Args::parse(&["json", "help"]) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    if args.flag("help") {
        println!(
            "transactional: the layer's insert rate ÷ its own transaction's; see the file's docs"
        );
        return ExitCode::SUCCESS;
    }
    if !args.benching() {
        // `cargo test --benches` runs this binary: nothing to check.
        return ExitCode::SUCCESS;
    }
    let duration = Duration::from_secs_f64(args.get("duration-secs", 5.0).unwrap());
    let rounds: usize = args.get("rounds", 3).unwrap();
    let server = PostgresServer::start();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let pool = PgPoolOptions::new()
            .max_connections(CLIENTS as u32 + 4)
            .connect(&server.url())
            .await
            .unwrap();
        sqlx::raw_sql("CREATE TABLE payments (id bigserial PRIMARY KEY, note text NOT NULL)")
            .execute(&pool)
            .await
            .unwrap();
        let builder = IdempotencyLayer::builder(LockEngine::in_memory())
            .unscoped()
            .transactional(pool.clone());
        builder.migrate().await.unwrap();
        let layer = builder.build().await.unwrap();
        let layered = serve(
            Router::new()
                .route("/payments", post(through_layer))
                .layer(layer),
        )
        .await;
        let bare = serve(
            Router::new()
                .route("/payments", post(own_transaction))
                .layer(Extension(pool.clone())),
        )
        .await;
        // Alternating rounds, so that a moment of competing load hits both sides; each
        // round's ratio pairs two neighbouring measurements, and the median round counts.
        let (mut ratios, mut layer_rates, mut bare_rates, mut bad) = (vec![], vec![], vec![], 0);
        for _ in 0..rounds {
            let (l, b1) = rate(layered, duration, true).await;
            let (b, b2) = rate(bare, duration, true).await;
            ratios.push(l / b);
            layer_rates.push(l);
            bare_rates.push(b);
            bad += b1 + b2;
        }
        let rounds_json: Vec<_> = layer_rates
            .iter()
            .zip(&bare_rates)
            .map(|(l, b)| json!([round(*l, 0), round(*b, 0)]))
            .collect();
        let (replay, replay_bad) = rate(layered, duration, false).await;
        println!(
            "{}",
            json!({
                "bench": "transactional", "scenario": "insert/16", "clients": CLIENTS,
                "layer_rps": round(median(&mut layer_rates), 0),
                "own_transaction_rps": round(median(&mut bare_rates), 0),
                "ratio": round(median(&mut ratios), 3), "rounds": rounds_json,
                "not_201": bad, "goal": ">= 0.7",
            })
        );
        println!(
            "{}",
            json!({
                "bench": "transactional", "scenario": "replay/16", "clients": CLIENTS,
                "rps": round(replay, 0), "not_201": replay_bad,
            })
        );
    });
    ExitCode::SUCCESS
}
