//! What the in-process record store really costs: the process's resident memory (RSS,
//! `/proc/self/statm`) grown per stored idempotency record, against what the record budget
//! charges for it. Prints one JSON object.
//!
//! ```sh
//! cargo bench --bench record_memory            # 100,000 records
//! cargo bench --bench record_memory -- --records 20000
//! ```
//!
//! The records are made the way an application makes them: `POST` requests with an
//! `Idempotency-Key` through the idempotency layer on an axum router (called in process,
//! no sockets), each answered `201` with a small JSON body. RSS is process-wide, which is
//! why this is a bench of its own (one process, nothing else running): a warm-up of a few
//! thousand requests first, so that the runtime, the router and the allocator's arenas
//! are in place, then the growth over the measured records.

mod support;

use std::{process::ExitCode, sync::Arc};

use axum::{
    body::Body,
    http::{Request, StatusCode},
    routing::post,
};
use http_body_util::BodyExt;
use serde_json::json;
use tower::ServiceExt;
use tower_lock::{IdempotencyLayer, LockEngine, MemoryBackend};

const WARM_UP: usize = 5_000;

fn app(engine: LockEngine) -> axum::Router {
    let layer = IdempotencyLayer::builder(engine)
        .unscoped()
        .build()
        .expect("a valid preset");
    axum::Router::new()
        .route(
            "/orders",
            post(|body: String| async move {
                (
                    StatusCode::CREATED,
                    [("content-type", "application/json")],
                    format!("{{\"order\":{}}}", body.len()),
                )
            }),
        )
        .layer(layer)
}

async fn order(app: &axum::Router, n: usize) {
    let request = Request::post("/orders")
        .header("idempotency-key", format!("\"order-{n:08}\""))
        .header("content-type", "application/json")
        .body(Body::from("{\"sku\":42,\"qty\":1}"))
        .expect("valid request");
    let response = app.clone().oneshot(request).await.expect("infallible");
    assert_eq!(response.status(), StatusCode::CREATED);
    let body = response
        .into_body()
        .collect()
        .await
        .expect("in-memory body");
    std::hint::black_box(body);
}

fn main() -> ExitCode {
    let args = match support::Args::parse(&["help"]) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("record_memory: {e}");
            return ExitCode::from(2);
        }
    };
    // Under `cargo test` (no `--bench`): a short run, to check that it works.
    let default = if args.benching() { 100_000 } else { 1_000 };
    let records: usize = match args.get("records", default) {
        Ok(n) => n,
        Err(e) => {
            eprintln!("record_memory: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let report = runtime.block_on(async {
        // A budget far above what the run stores: nothing is evicted.
        let backend = Arc::new(MemoryBackend::with_record_budget(1 << 40));
        let app = app(LockEngine::from_arc(backend.clone()));
        for n in 0..WARM_UP {
            order(&app, n).await;
        }
        let (rss_before, charged_before) = (support::rss_kib(), backend.record_bytes());
        for n in WARM_UP..WARM_UP + records {
            order(&app, n).await;
        }
        let (rss_after, charged_after) = (support::rss_kib(), backend.record_bytes());
        assert_eq!(backend.evicted_records(), 0);
        let per_record = |bytes: f64| support::round(bytes / records as f64, 1);
        let grown = match (rss_before, rss_after) {
            (Some(b), Some(a)) => Some(per_record(a.saturating_sub(b) as f64 * 1024.0)),
            _ => None,
        };
        let charged = per_record((charged_after - charged_before) as f64);
        json!({
            "bench": "record_memory",
            "records": records,
            "rss_grown_per_record": grown,
            "charged_per_record": charged,
            "ratio": grown.map(|g| support::round(g / charged, 2)),
        })
    });
    println!("{report}");
    ExitCode::SUCCESS
}
