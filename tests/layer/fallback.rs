//! A layer installed with axum's `Router::layer` (not `route_layer`) also wraps the
//! router's fallback: requests that match no route pass it unlocked, whatever the key,
//! so axum still answers them `404`, never `400`, `423` or `500`.

use axum::{Router, routing::post};
use http::StatusCode;
use tower_lock::{IdempotencyLayer, LockEngine, LockLayer, key::HeaderKey};
use tower_lock_axum::RouteKey;
use tower_lock_test_support::{
    gate::{GateControl, gate},
    http::{TestServer, serve},
};

/// `/jobs` behind a layer keyed on `x-tenant-id`, installed with `Router::layer`; the
/// handler waits at a gate.
async fn jobs_under_router_layer() -> (TestServer, GateControl) {
    let (gate, control) = gate();
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
        .layer(layer);
    (serve(app).await, control)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_path_under_router_layer_stays_404_with_any_key() {
    let (server, mut control) = jobs_under_router_layer().await;
    let held = server.post("/jobs", &[("x-tenant-id", "acme")]);
    let others = async {
        control.arrived().await;
        // The tenant's lock is held: a matched route is answered 423.
        let busy = server.post("/jobs", &[("x-tenant-id", "acme")]).await;
        assert_eq!(busy.status, StatusCode::LOCKED);
        // An unknown path is not the layer's: 404, with or without the key.
        let unknown = server.post("/nowhere", &[("x-tenant-id", "acme")]).await;
        assert_eq!(unknown.status, StatusCode::NOT_FOUND, "{}", unknown.text());
        let keyless = server.post("/nowhere", &[]).await;
        assert_eq!(keyless.status, StatusCode::NOT_FOUND, "{}", keyless.text());
        control.open();
    };
    let (held, ()) = tokio::join!(held, others);
    assert_eq!(held.status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_key_under_router_layer_leaves_unknown_paths_404() {
    let layer = LockLayer::builder(LockEngine::in_memory())
        .key(RouteKey::params())
        .build()
        .unwrap();
    let app = Router::new()
        .route("/t/{id}", post(|| async { "ok" }))
        .layer(layer.clone());
    let server = serve(app).await;
    assert_eq!(server.post("/t/1", &[]).await.status, StatusCode::OK);
    let unknown = server.post("/nowhere", &[]).await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND, "{}", unknown.text());
    // It ran unlocked, and counts so.
    let snap = layer.metrics().snapshot();
    assert_eq!((snap.acquired, snap.unlocked), (1, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotency_layer_under_router_layer_leaves_unknown_paths_404() {
    let layer = IdempotencyLayer::builder(LockEngine::in_memory())
        .unscoped()
        .build()
        .unwrap();
    let app = Router::new()
        .route("/charges", post(|| async { "charged" }))
        .layer(layer);
    let server = serve(app).await;
    // A keyless POST to a route is the client's mistake: 400.
    let keyless = server.post("/charges", &[]).await;
    assert_eq!(keyless.status, StatusCode::BAD_REQUEST);
    // To no route at all: axum's 404.
    let unknown = server.post("/nowhere", &[]).await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND, "{}", unknown.text());
}

/// The layer says once why it let a request through: an operator learns the fix from the
/// first unknown path, and the thousandth does not repeat it.
#[tokio::test]
async fn the_first_unmatched_request_is_logged_once() {
    use tower_lock_core::Outcome;
    use tracing::Level;
    use tracing_subscriber::prelude::*;

    use super::log_capture::Capture;

    let capture = Capture::default();
    let _subscriber =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(capture.clone()));
    let locker = LockLayer::builder(LockEngine::in_memory())
        .key(HeaderKey::new("x-tenant-id"))
        .metrics_name("jobs")
        .build_locker()
        .unwrap();
    // What axum's router leaves in a request it routes to its fallback: the original URI,
    // and no matched path.
    let unmatched = || {
        let mut req = http::Request::post("/nowhere")
            .header("x-tenant-id", "acme")
            .body(())
            .unwrap();
        let uri = req.uri().clone();
        req.extensions_mut().insert(axum::extract::OriginalUri(uri));
        req
    };
    for _ in 0..3 {
        assert!(matches!(
            locker.acquire(&unmatched()).await,
            Outcome::Unlocked
        ));
    }
    let events = capture.take();
    let warned: Vec<_> = events
        .iter()
        .filter(|e| e.level == Level::WARN && e.message().contains("route_layer"))
        .collect();
    assert_eq!(warned.len(), 1, "{events:#?}");
    assert_eq!(warned[0].fields["layer"], "jobs");
    assert_eq!(warned[0].fields["path"], "/nowhere");
    assert_eq!(locker.metrics().snapshot().unlocked, 3);
}
