//! The axum integration through a `Router`: extractors, route keys, and `route_layer`.

use std::time::Duration;

use axum::{
    Router,
    body::Body,
    http::{Request, StatusCode},
    routing::{get, post},
};
use http_body_util::BodyExt;
use tokio::sync::{mpsc, watch};
use tower::ServiceExt;
use tower_lock::{LockEngine, LockLayer, MissingKeyPolicy};
use tower_lock_axum::{LockFence, Locked, RouteKey};

async fn call(app: &Router, method: &str, uri: &str) -> (StatusCode, String) {
    let res = app
        .clone()
        .oneshot(
            Request::builder()
                .method(method)
                .uri(uri)
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    let status = res.status();
    let body = res.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8(body.to_vec()).unwrap())
}

/// A router whose handler reports its lock key, then waits for the gate to open.
fn gated(key: RouteKey) -> (Router, mpsc::UnboundedReceiver<String>, watch::Sender<bool>) {
    let (arrived_tx, arrived_rx) = mpsc::unbounded_channel();
    let (open_tx, open_rx) = watch::channel(false);
    let handler = move |Locked(lease): Locked| {
        let (arrived_tx, mut open_rx) = (arrived_tx.clone(), open_rx.clone());
        async move {
            arrived_tx.send(lease.key().to_string()).unwrap();
            open_rx.wait_for(|o| *o).await.unwrap();
            lease.key().to_string()
        }
    };
    let layer = LockLayer::builder(LockEngine::in_memory())
        .key(key)
        .build()
        .unwrap();
    let app = Router::new()
        .route("/tenants/{id}/jobs/{job}", post(handler.clone()))
        .route("/files/{*path}", post(handler))
        .route_layer(layer);
    (app, arrived_rx, open_tx)
}

async fn arrived(rx: &mut mpsc::UnboundedReceiver<String>) -> String {
    tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("handler reached")
        .unwrap()
}

#[tokio::test]
async fn route_params_key_serializes_per_parameter_value() {
    let (app, mut arrived_rx, open) = gated(RouteKey::param("id"));
    let first = tokio::spawn({
        let app = app.clone();
        async move { call(&app, "POST", "/tenants/7/jobs/1").await }
    });
    assert_eq!(
        arrived(&mut arrived_rx).await,
        "/axum-route//tenants/{id}/jobs/{job}|id=7"
    );
    // Same tenant, another job: same key.
    assert_eq!(
        call(&app, "POST", "/tenants/7/jobs/2").await.0,
        StatusCode::LOCKED
    );
    // Another tenant: another key.
    let other = tokio::spawn({
        let app = app.clone();
        async move { call(&app, "POST", "/tenants/8/jobs/1").await }
    });
    assert_eq!(
        arrived(&mut arrived_rx).await,
        "/axum-route//tenants/{id}/jobs/{job}|id=8"
    );
    open.send_replace(true);
    assert_eq!(first.await.unwrap().0, StatusCode::OK);
    assert_eq!(other.await.unwrap().0, StatusCode::OK);
}

#[tokio::test]
async fn route_keys_name_the_route_and_escape_values() {
    let (app, mut arrived_rx, open) = gated(RouteKey::params());
    open.send_replace(true);
    let (status, key) = call(&app, "POST", "/tenants/a%7Cb/jobs/9").await;
    assert_eq!(status, StatusCode::OK);
    // Decoded like axum's `Path` (`a|b`), then escaped so it cannot pose as a parameter.
    assert_eq!(key, "/axum-route//tenants/{id}/jobs/{job}|id=a%7Cb|job=9");
    // Two spellings of one tenant are one key.
    let (_, plain) = call(&app, "POST", "/tenants/acme/jobs/1").await;
    let (_, encoded) = call(&app, "POST", "/tenants/acm%65/jobs/1").await;
    assert_eq!(plain, encoded);
    let (_, key) = call(&app, "POST", "/files/x/y.txt").await;
    assert_eq!(key, "/axum-route//files/{*path}|path=x/y.txt");
    arrived_rx.close();

    let (app, _rx, open) = gated(RouteKey::route());
    open.send_replace(true);
    assert_eq!(
        call(&app, "POST", "/tenants/1/jobs/2").await.1,
        "/axum-route//tenants/{id}/jobs/{job}"
    );
}

#[tokio::test]
async fn route_layer_leaves_404_and_405_alone() {
    let (app, _rx, open) = gated(RouteKey::params());
    open.send_replace(true);
    assert_eq!(
        call(&app, "POST", "/nowhere").await.0,
        StatusCode::NOT_FOUND
    );
    // `PUT`, which the layer locks by default (a `GET` would pass it unlocked anyway).
    assert_eq!(
        call(&app, "PUT", "/tenants/1/jobs/2").await.0,
        StatusCode::METHOD_NOT_ALLOWED
    );
}

#[tokio::test]
async fn under_router_layer_an_unknown_path_passes_and_stays_404() {
    let layer = LockLayer::builder(LockEngine::in_memory())
        .key(RouteKey::params())
        .build()
        .unwrap();
    let app = Router::new()
        .route("/t/{id}", post(|| async { "ok" }))
        .layer(layer);
    assert_eq!(call(&app, "POST", "/t/1").await.0, StatusCode::OK);
    // The fallback is wrapped as well: a request that matched no route is not the
    // layer's, so it stays a 404 (the first is logged, naming route_layer as the fix).
    assert_eq!(
        call(&app, "POST", "/nowhere").await.0,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn nested_routers_key_on_the_full_path() {
    let layer = LockLayer::builder(LockEngine::in_memory())
        .key(RouteKey::params())
        .build()
        .unwrap();
    let inner = Router::new()
        .route(
            "/t/{id}",
            post(|Locked(l): Locked| async move { l.key().to_string() }),
        )
        .route_layer(layer);
    let app = Router::new().nest("/api/{version}", inner);
    let (status, key) = call(&app, "POST", "/api/v2/t/5").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(key, "/axum-route//api/{version}/t/{id}|version=v2|id=5");
}

#[tokio::test]
async fn lease_extractors_need_the_layer_and_option_tolerates_its_absence() {
    let app = Router::new()
        .route(
            "/required",
            get(|LockFence(f): LockFence| async move { f.to_string() }),
        )
        .route(
            "/optional",
            get(|l: Option<Locked>| async move {
                l.map_or("none".to_owned(), |l| l.0.fence().to_string())
            }),
        );
    let (status, body) = call(&app, "GET", "/required").await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(body.contains("tower-lock layer"));
    assert_eq!(
        call(&app, "GET", "/optional").await,
        (StatusCode::OK, "none".to_owned())
    );

    let locked = app.route_layer(
        LockLayer::builder(LockEngine::in_memory())
            .key(RouteKey::route())
            .methods(["GET"])
            .on_missing_key(MissingKeyPolicy::Reject)
            .build()
            .unwrap(),
    );
    let (status, fence) = call(&locked, "GET", "/required").await;
    assert_eq!(status, StatusCode::OK);
    assert!(fence.parse::<u64>().unwrap() >= 1);
}

/// A parameter the route does not have is the server's mistake: `500`, not a `400` that
/// blames the client.
#[tokio::test]
async fn a_route_parameter_the_route_lacks_is_a_server_error() {
    let layer = LockLayer::builder(LockEngine::in_memory())
        .key(RouteKey::param("tenant"))
        .build()
        .unwrap();
    let app = Router::new()
        .route("/t/{id}", post(|| async { "ok" }))
        .route_layer(layer);
    let (status, body) = call(&app, "POST", "/t/1").await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{body}");
    assert!(
        body.contains("urn:tower-lock:problem:misconfigured"),
        "{body}"
    );
}

/// A parameter name that can never match is refused when the layer is built.
#[test]
fn a_parameter_name_that_can_never_match_is_refused_by_build() {
    let built = LockLayer::builder(LockEngine::in_memory())
        .key(RouteKey::param("{id}"))
        .build();
    let Err(err) = built else {
        panic!("a parameter name with braces is refused")
    };
    assert!(err.to_string().contains("{id}"), "{err}");
}
