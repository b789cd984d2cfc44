//! The lock and the router, over real sockets: `HEAD`, which axum (and actix-web) answer
//! with the `GET` handler, is locked wherever `GET` is.

use axum::{Router, routing::get};
use http::StatusCode;
use tower_lock::{LockEngine, LockLayer, key::HeaderKey};
use tower_lock_test_support::{
    gate::{Gate, GateControl, gate},
    http::{TestServer, serve},
};

/// `GET` and `PUT /docs` under `layer`: the `PUT` waits at the gate, the `GET` (which
/// axum runs for a `HEAD` too) answers at once.
async fn axum_docs(layer: LockLayer, gate: Gate) -> TestServer {
    let write = move || async move {
        let _inside = gate.pass("put".to_owned()).await;
        "written"
    };
    let app = Router::new()
        .route("/docs", get(|| async { "read" }).put(write))
        .route_layer(layer);
    serve(app).await
}

/// While a `PUT` holds the key, a `HEAD` is refused as a `GET` is (`423`): it runs the
/// `GET` handler, so it is a read that must not run beside the writer.
async fn head_is_locked_as_get(server: TestServer, mut control: GateControl) {
    let key = [("x-key", "d")];
    let writer = server.send("PUT", "/docs", &key);
    let readers = async {
        control.arrived().await;
        let get = server.send("GET", "/docs", &key).await;
        let head = server.send("HEAD", "/docs", &key).await;
        control.open();
        (get, head)
    };
    let (writer, (get, head)) = tokio::join!(writer, readers);
    assert_eq!(writer.status, StatusCode::OK);
    assert_eq!(get.status, StatusCode::LOCKED);
    assert_eq!(
        head.status,
        StatusCode::LOCKED,
        "HEAD ran beside the writer"
    );
    // Once the writer is done, both read.
    assert_eq!(
        server.send("HEAD", "/docs", &key).await.status,
        StatusCode::OK
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn axum_shared_for_get_locks_head_too() {
    let layer = LockLayer::builder(LockEngine::in_memory())
        .key(HeaderKey::new("x-key"))
        .shared_for(["GET"])
        .build()
        .unwrap();
    let (gate, control) = gate();
    head_is_locked_as_get(axum_docs(layer, gate).await, control).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn axum_methods_get_locks_head_too() {
    let layer = LockLayer::builder(LockEngine::in_memory())
        .key(HeaderKey::new("x-key"))
        .methods(["GET", "PUT"])
        .build()
        .unwrap();
    let (gate, control) = gate();
    head_is_locked_as_get(axum_docs(layer, gate).await, control).await;
}
