//! The lock and the router, over real sockets on axum and actix: a wrong method on a
//! matched path stays a `405` (it takes no lock, needs no key), and `HEAD`, which both
//! frameworks answer with the `GET` handler, is locked wherever `GET` is.

use actix_web::{App, web};
use axum::{
    Router,
    routing::{get, post},
};
use http::StatusCode;
use tower_lock::{LockEngine, LockLayer, key::HeaderKey};
use tower_lock_actix::LockMiddleware;
use tower_lock_test_support::{
    gate::{Gate, GateControl, gate},
    http::{TestServer, serve, serve_actix},
};

/// A layer keyed on `x-key`, answering `423` at once.
fn layer() -> LockLayer {
    LockLayer::builder(LockEngine::in_memory())
        .key(HeaderKey::new("x-key"))
        .build()
        .unwrap()
}

/// `POST /jobs` under the lock as axum's docs advise: per method router, or on the
/// router (`route_layer`) with its wrong-method answer put back outside the lock
/// (`method_not_allowed_fallback`); the handler waits at the gate.
async fn axum_jobs(gate: Gate, per_method: bool) -> TestServer {
    let handler = move || async move {
        let _inside = gate.pass("post".to_owned()).await;
        "done"
    };
    let app = if per_method {
        Router::new().route("/jobs", post(handler).route_layer(layer()))
    } else {
        Router::new()
            .route("/jobs", post(handler))
            .route_layer(layer())
            .method_not_allowed_fallback(|| async { StatusCode::METHOD_NOT_ALLOWED })
    };
    serve(app).await
}

/// `POST /jobs` under the lock as actix's docs advise: on the route (`Route::wrap`), not
/// the resource, whose wrong-method answer the route does not wrap.
fn actix_jobs(gate: Gate) -> TestServer {
    let lock = LockMiddleware::try_from(layer()).unwrap();
    serve_actix(2, move || {
        let gate = gate.clone();
        App::new().service(
            web::resource("/jobs").route(
                web::post()
                    .to(move || {
                        let gate = gate.clone();
                        async move {
                            let _inside = gate.pass("post".to_owned()).await;
                            "done"
                        }
                    })
                    .wrap(lock.clone()),
            ),
        )
    })
}

/// A `PUT` on the `POST`-only route is `405`, without a key, and while a `POST` holds the
/// key it would have asked for.
async fn a_wrong_method_stays_a_405(server: TestServer, mut control: GateControl) {
    let reply = server.send("PUT", "/jobs", &[]).await;
    assert_eq!(
        reply.status,
        StatusCode::METHOD_NOT_ALLOWED,
        "{}",
        reply.text()
    );
    let key = [("x-key", "k")];
    let holder = server.post("/jobs", &key);
    let wrong = async {
        control.arrived().await;
        let reply = server.send("PUT", "/jobs", &key).await;
        control.open();
        reply
    };
    let (holder, wrong) = tokio::join!(holder, wrong);
    assert_eq!(holder.status, StatusCode::OK);
    assert_eq!(
        wrong.status,
        StatusCode::METHOD_NOT_ALLOWED,
        "{}",
        wrong.text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn axum_a_wrong_method_stays_a_405_per_method_router() {
    let (gate, control) = gate();
    a_wrong_method_stays_a_405(axum_jobs(gate, true).await, control).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn axum_a_wrong_method_stays_a_405_on_the_router() {
    let (gate, control) = gate();
    a_wrong_method_stays_a_405(axum_jobs(gate, false).await, control).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn actix_a_wrong_method_stays_a_405() {
    let (gate, control) = gate();
    a_wrong_method_stays_a_405(actix_jobs(gate), control).await;
}

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
