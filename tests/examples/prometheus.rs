//! `examples/prometheus.rs` over a real socket: after a few requests, its `/metrics`
//! exports every tower-lock series with the layers' names, recorded through the `metrics`
//! facade (the feature this test needs: without it nothing is recorded and it would fail).

#![allow(clippy::duplicate_mod)]

#[path = "../../examples/prometheus.rs"]
#[allow(dead_code)]
mod prometheus_example;

use std::time::Duration;

use http::StatusCode;
use tower_lock::LockEngine;
use tower_lock_test_support::{http::serve, scenarios::hold};

#[tokio::test]
async fn metrics_endpoint_exports_the_layers_series_after_a_few_requests() {
    // The recorder is the process's, installed once: no other test of this binary installs
    // one or names a layer `orders` or `reports`, so the series read here are this app's.
    let handle = prometheus_example::install_recorder().unwrap();
    let engine = LockEngine::in_memory();
    let server =
        serve(prometheus_example::app(engine.clone(), handle, Duration::ZERO).unwrap()).await;
    let order = |k: &'static str| [("idempotency-key", k)];

    assert_eq!(
        server.post("/orders", &order("\"o-1\"")).await.status,
        StatusCode::CREATED
    );
    assert_eq!(
        server.post("/orders", &order("\"o-2\"")).await.status,
        StatusCode::CREATED
    );
    // A retry of a completed order is answered with its stored response.
    let replay = server.post("/orders", &order("\"o-1\"")).await;
    assert_eq!(replay.status, StatusCode::CREATED);
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    assert_eq!(
        server.post("/orders", &[]).await.status,
        StatusCode::BAD_REQUEST
    );
    let held = hold(&engine, "/idempotency-key/o-3").await;
    assert_eq!(
        server.post("/orders", &order("\"o-3\"")).await.status,
        StatusCode::CONFLICT
    );
    drop(held);
    let tenant = [("x-tenant-id", "acme")];
    assert_eq!(
        server.post("/reports", &tenant).await.status,
        StatusCode::CREATED
    );

    let scrape = server.send("GET", "/metrics", &[]).await;
    assert_eq!(scrape.status, StatusCode::OK);
    assert_eq!(
        scrape.header("content-type"),
        Some("text/plain; version=0.0.4")
    );
    let text = scrape.text();
    for series in [
        "# TYPE tower_lock_acquired_total counter",
        "tower_lock_acquired_total{layer=\"orders\"} 2",
        "tower_lock_acquired_total{layer=\"reports\"} 1",
        "tower_lock_rejected_total{layer=\"orders\",reason=\"missing-key\"} 1",
        "tower_lock_rejected_total{layer=\"orders\",reason=\"conflict\"} 1",
        "tower_lock_contended_total{layer=\"orders\"} 1",
        "tower_lock_replayed_total{layer=\"orders\"} 1",
        "# TYPE tower_lock_wait_seconds histogram",
        "tower_lock_wait_seconds_bucket{layer=\"reports\",le=\"0.001\"}",
        "tower_lock_wait_seconds_count{layer=\"reports\"} 1",
        "# TYPE tower_lock_hold_seconds histogram",
        "tower_lock_hold_seconds_bucket{layer=\"orders\",le=\"+Inf\"} 2",
        "tower_lock_hold_seconds_count{layer=\"orders\"} 2",
        "# TYPE tower_lock_requests_holding gauge",
        "tower_lock_requests_holding{layer=\"orders\"} 0",
        "# HELP tower_lock_hold_seconds",
    ] {
        assert!(text.contains(series), "no {series:?} in\n{text}");
    }
}
