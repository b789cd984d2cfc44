//! Responses without a body, through a real server socket (axum on 127.0.0.1:0, hyper-util
//! client), on every backend: hyper never polls a body that must be empty, so the layer
//! releases such a response's key before handing its head to the server. The same
//! client's next request for the key must then never meet its own previous lease.

mod support;

use axum::{
    Router,
    http::{HeaderName, StatusCode},
    routing::get,
};
use support::http::serve;
use tower_lock::{LockEngine, LockLayer, key::HeaderKey};

/// Back-to-back requests per kind of response: the race this guards against was lost in
/// about 2 % of requests.
const ROUNDS: usize = 300;

/// Every kind of bodiless response, `ROUNDS` times back to back on one connection for one
/// key, under `wait = 0` (a held key is answered `423` at once): each request gets its
/// own status, never `423`, and the key is free once the last response is in.
async fn bodiless_responses_release_the_key_before_the_client_has_them(engine: LockEngine) {
    let layer = LockLayer::builder(engine.clone())
        .key(HeaderKey::new(HeaderName::from_static("x-key")))
        .build()
        .unwrap();
    let app = Router::new()
        .route("/empty", get(|| async { "" }))
        .route("/no-content", get(|| async { StatusCode::NO_CONTENT }))
        .route("/not-modified", get(|| async { StatusCode::NOT_MODIFIED }))
        // Asked with HEAD: the handler writes a body, the server sends none.
        .route("/page", get(|| async { "a page with a body" }))
        .route_layer(layer);
    let server = serve(app).await;

    let kinds = [
        ("GET", "/empty", StatusCode::OK),
        ("GET", "/no-content", StatusCode::NO_CONTENT),
        ("GET", "/not-modified", StatusCode::NOT_MODIFIED),
        ("HEAD", "/page", StatusCode::OK),
    ];
    let mut refused = Vec::new();
    for (method, path, status) in kinds {
        let mut locked = 0;
        for round in 0..ROUNDS {
            let reply = server
                .send(server.request(method, path).header("x-key", "k"))
                .await;
            if reply.status == StatusCode::LOCKED {
                locked += 1;
                continue;
            }
            assert_eq!(reply.status, status, "{method} {path}, round {round}");
            assert!(reply.body.is_empty(), "{method} {path}: {:?}", reply.body);
        }
        refused.push((format!("{method} {path}"), locked));
    }
    assert!(
        refused.iter().all(|(_, locked)| *locked == 0),
        "requests answered 423 (of {ROUNDS} per kind): {refused:?}"
    );
    assert!(
        !engine
            .lock(tower_lock::key::encode("", "header=x-key", "k"))
            .locked()
            .await
            .unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodiless_responses_release_the_key_before_the_client_has_them_in_process() {
    bodiless_responses_release_the_key_before_the_client_has_them(LockEngine::in_memory()).await;
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodiless_responses_release_the_key_before_the_client_has_them_on_redis() {
    use tower_lock::engine::redis::RedisBackend;
    use tower_lock_test_support::redis::RedisServer;

    let backend = RedisBackend::builder(RedisServer::shared().url())
        .prefix("layer-bodiless")
        .build()
        .await
        .expect("connect to the test redis-server");
    bodiless_responses_release_the_key_before_the_client_has_them(LockEngine::new(backend)).await;
}
