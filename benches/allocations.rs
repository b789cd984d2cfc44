//! Allocations per locked request: a counting global allocator around the layer, the lock
//! taken by hand, the bare service, and one engine cycle per backend. Prints one JSON
//! object.
//!
//! ```sh
//! cargo bench --bench allocations                  # memory; Redis too if REDIS_URL is set
//! ```
//!
//! Counts are averages over many requests after a warm-up (a few allocations are
//! amortized: buffers that grow once, the watchdog's first start), so a figure like 11.02
//! means 11 per request. Every thread's allocations count, the engine's own included.

mod support;

use std::process::ExitCode;

use axum::{
    body::Body,
    http::{Request, StatusCode},
};
use http_body_util::BodyExt;
use serde_json::json;
use tower::ServiceExt;
use tower_lock::LockEngine;

#[global_allocator]
static GLOBAL: support::counting::Counting = support::counting::Counting;

const WARM_UP: u64 = 200;

/// Allocations per call of `op`, averaged over `n` calls after a warm-up.
async fn per_call<F, Fut>(n: u64, mut op: F) -> f64
where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    for _ in 0..WARM_UP {
        op().await;
    }
    let before = support::counting::allocations();
    for _ in 0..n {
        op().await;
    }
    let after = support::counting::allocations();
    ((after - before) as f64 / n as f64 * 100.0).round() / 100.0
}

fn request() -> Request<Body> {
    Request::get("/items/k1")
        .header(support::KEY_HEADER, "k1")
        .body(Body::empty())
        .expect("valid request")
}

async fn call(app: &axum::Router) {
    let response = app.clone().oneshot(request()).await.expect("infallible");
    assert_eq!(response.status(), StatusCode::OK);
    let body = response
        .into_body()
        .collect()
        .await
        .expect("in-memory body");
    std::hint::black_box(body);
}

async fn cycle(engine: &LockEngine) {
    let lease = engine.lock("alloc:k").acquire().await.expect("uncontended");
    lease.release().await.expect("release");
}

fn main() -> ExitCode {
    let args = match support::Args::parse(&["help"]) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("allocations: {e}");
            return ExitCode::from(2);
        }
    };
    // Under `cargo test` (no `--bench`): a short run, to check that it works.
    let n = if args.benching() { 20_000 } else { 200 };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let report = runtime.block_on(async {
        let bare = support::app();
        let engine = LockEngine::in_memory();
        let by_hand = support::app_locking_in_handler(engine.clone());
        let layered = support::with_lock_layer(support::app(), engine.clone(), false);
        let bare_n = per_call(n, || call(&bare)).await;
        let layer_n = per_call(n, || call(&layered)).await;
        let hand_n = per_call(n, || call(&by_hand)).await;
        let memory_n = per_call(n, || cycle(&engine)).await;
        let redis_n = match support::redis_url_from_env() {
            Some(url) => match support::redis_engine(&url, "alloc").await {
                Ok(redis) => Some(per_call(n / 10, || cycle(&redis)).await),
                Err(e) => {
                    eprintln!("allocations: redis skipped ({e})");
                    None
                }
            },
            None => None,
        };
        json!({
            "bench": "allocations",
            "bare_per_request": bare_n,
            "lock_layer_memory_per_request": layer_n,
            "lock_layer_memory_extra_per_request": ((layer_n - bare_n) * 100.0).round() / 100.0,
            "lock_in_handler_memory_per_request": hand_n,
            "engine_memory_per_cycle": memory_n,
            "engine_redis_per_cycle": redis_n,
        })
    });
    println!("{report}");
    ExitCode::SUCCESS
}
