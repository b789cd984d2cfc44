//! Telling layers apart: `build()` warns when a layer takes a default name (its `layer`
//! label in metrics and logs) that a live layer on the same engine already has, and the
//! most contended keys are counted by key, in a label set with a cap.

use axum::{Router, routing::post};
use http::StatusCode;
use tower_lock::{LockEngine, LockLayer, key::HeaderKey};
use tower_lock_axum::RouteKey;
use tower_lock_test_support::{gate::gate, http::serve};
use tracing::Level;
use tracing_subscriber::prelude::*;

use super::log_capture::{Capture, Captured};

fn name_warnings(events: &[Captured]) -> Vec<&Captured> {
    events
        .iter()
        .filter(|e| e.level == Level::WARN && e.message().contains("metrics_name"))
        .collect()
}

#[test]
fn a_second_layer_with_the_same_default_name_on_one_engine_is_warned_at_build() {
    let capture = Capture::default();
    let _subscriber =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(capture.clone()));
    let engine = LockEngine::in_memory();
    let route_layer = || {
        LockLayer::builder(engine.clone())
            .key(RouteKey::params())
            .build()
            .unwrap()
    };
    let reports = route_layer();
    assert!(name_warnings(&capture.take()).is_empty());
    // Both would be `axum-route` in every series and log line.
    let jobs = route_layer();
    let events = capture.take();
    let warned = name_warnings(&events);
    assert_eq!(warned.len(), 1, "{events:#?}");
    assert_eq!(warned[0].fields["layer"], "axum-route");

    // A name of its own, or another engine: nothing to warn about.
    let named = LockLayer::builder(engine.clone())
        .key(RouteKey::params())
        .metrics_name("exports")
        .build()
        .unwrap();
    let elsewhere = LockLayer::builder(LockEngine::in_memory())
        .key(RouteKey::params())
        .build()
        .unwrap();
    assert!(name_warnings(&capture.take()).is_empty());

    // A layer that is gone no longer holds its name.
    drop((reports, jobs));
    let again = route_layer();
    assert!(name_warnings(&capture.take()).is_empty());
    drop((named, elsewhere, again));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contention_is_counted_by_key() {
    let (gate, mut control) = gate();
    let layer = LockLayer::builder(LockEngine::in_memory())
        .key(HeaderKey::new("x-tenant-id"))
        .build()
        .unwrap();
    let app = Router::new()
        .route(
            "/jobs",
            post(move || {
                let gate = gate.clone();
                async move {
                    let _inside = gate.pass("job".to_owned()).await;
                    "done"
                }
            }),
        )
        .route_layer(layer.clone());
    let server = serve(app).await;

    let held = server.post("/jobs", &[("x-tenant-id", "acme")]);
    let others = async {
        control.arrived().await;
        for _ in 0..3 {
            let busy = server.post("/jobs", &[("x-tenant-id", "acme")]).await;
            assert_eq!(busy.status, StatusCode::LOCKED);
        }
        control.open();
    };
    let (held, ()) = tokio::join!(held, others);
    assert_eq!(held.status, StatusCode::OK);
    assert_eq!(
        server
            .post("/jobs", &[("x-tenant-id", "globex")])
            .await
            .status,
        StatusCode::OK
    );
    let snap = layer.metrics().snapshot();
    assert_eq!(snap.contended, 3);
    assert_eq!(
        snap.contended_keys,
        [("/header=x-tenant-id/acme".to_owned(), 3)]
    );
}
