//! The lock layers' metrics on `/metrics`, in the Prometheus text format, through the
//! `metrics` facade (feature `metrics`) and `metrics-exporter-prometheus`.
//!
//! - `POST /orders`: the Idempotency-Key preset (series labelled `layer="orders"`).
//! - `POST /reports`: one report at a time per `x-tenant-id`, waiting up to 1 s
//!   (`layer="reports"`).
//! - `GET /metrics`: every `tower_lock_*` series: counters, wait and hold histograms (with
//!   tower-lock's bucket bounds, in seconds), holding and waiting gauges.
//!
//! ```sh
//! cargo run --example prometheus --features metrics   # http://127.0.0.1:3002; PORT to change it
//! curl -s -X POST http://127.0.0.1:3002/orders -H 'Idempotency-Key: "o-1"'
//! curl -s http://127.0.0.1:3002/metrics | grep tower_lock_
//! ```

mod common;

use std::{error::Error, time::Duration};

use axum::{
    Router,
    http::{StatusCode, header},
    routing::{get, post},
};
use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder, PrometheusHandle};
use tokio::net::TcpListener;
use tower_lock::{
    ConfigError, IdempotencyLayer, LockEngine, LockLayer, key::HeaderKey,
    metrics::BUCKET_BOUNDS_SECONDS,
};

/// Installs the Prometheus recorder as the process's `metrics` recorder (once per
/// process, before any layer records), with tower-lock's bucket bounds for its
/// `_seconds` histograms, so they export as histograms rather than summaries.
pub(crate) fn install_recorder() -> Result<PrometheusHandle, BuildError> {
    PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Prefix("tower_lock_".to_owned()),
            &BUCKET_BOUNDS_SECONDS,
        )?
        .install_recorder()
}

/// The app: two guarded routes, each layer named for its metrics, and `/metrics`.
pub(crate) fn app(
    engine: LockEngine,
    metrics: PrometheusHandle,
    work: Duration,
) -> Result<Router, ConfigError> {
    let orders = IdempotencyLayer::builder(engine.clone())
        // Anonymous here, to keep the example about metrics; scope a real endpoint per
        // principal (see the demo).
        .unscoped()
        .metrics_name("orders")
        .build()?;
    let reports = LockLayer::builder(engine)
        .key(HeaderKey::new("x-tenant-id"))
        .wait(Duration::from_secs(1))
        .metrics_name("reports")
        .build()?;
    let handler = move || async move {
        tokio::time::sleep(work).await;
        (StatusCode::CREATED, "done\n")
    };
    Ok(Router::new()
        .route("/orders", post(handler))
        .route_layer(orders)
        .merge(
            Router::new()
                .route("/reports", post(handler))
                .route_layer(reports),
        )
        .route(
            "/metrics",
            get(move || async move {
                (
                    [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
                    metrics.render(),
                )
            }),
        ))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let metrics = install_recorder()?;
    // The exporter's histograms keep their recent samples until upkeep drains them.
    let upkeep = metrics.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            upkeep.run_upkeep();
        }
    });
    let engine = common::engine_from_env().await;
    let listener = TcpListener::bind(common::listen_addr(3002)).await?;
    let addr = listener.local_addr()?;
    println!(
        "tower-lock metrics on http://{addr}/metrics\n\
         Try: curl -s -X POST http://{addr}/orders -H 'Idempotency-Key: \"o-1\"'; \
         curl -s http://{addr}/metrics | grep tower_lock_"
    );
    axum::serve(listener, app(engine, metrics, Duration::from_millis(200))?).await?;
    Ok(())
}
