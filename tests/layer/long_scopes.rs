//! Any legal key works under any scope, on the lock layer too: a tenant or a principal of
//! any length is written in the lock key as its digest, so a 255-character
//! `Idempotency-Key` is never turned into a `400` by the server's own scope. Over real
//! sockets, on axum and on actix-web.

use std::fmt;

use axum::{Extension, extract::Request, middleware::Next, response::Response, routing::post};
use http::StatusCode;
use tower_lock::{
    IdempotencyLayer, LeaseInfo, LockEngine, LockLayer,
    key::{IdempotencyKey, MAX_IDEMPOTENCY_KEY_LEN, ScopedKey},
};
use tower_lock_actix::LockMiddleware;
use tower_lock_test_support::{
    http::{TestServer, serve, serve_actix},
    scenarios::ACTIX_WORKERS,
};

/// An issuer URL and a subject: about 240 characters, ending in `last`.
fn long_scope(last: char) -> String {
    let subject = "service-account/payments-reconciliation-worker/eu-west-1/".repeat(3);
    format!("https://login.identity-provider.example.com/7f3e2c1a/oauth2/v2.0|{subject}{last}")
}

/// The documented maximum, with characters that mean something elsewhere.
fn longest_key() -> String {
    let key: String = "k/%{}:|"
        .chars()
        .cycle()
        .take(MAX_IDEMPOTENCY_KEY_LEN)
        .collect();
    format!("\"{key}\"")
}

/// `POST /orders` as `tenant` with the longest key: the status and the body (the lock key
/// the handler held, on axum).
async fn order(server: &TestServer, tenant: &str) -> (StatusCode, String) {
    let key = longest_key();
    let reply = server
        .send_body(
            "POST",
            "/orders",
            &[("x-tenant", tenant), ("idempotency-key", key.as_str())],
            "",
        )
        .await;
    (reply.status, reply.text())
}

fn tenant_layer() -> LockLayer {
    LockLayer::builder(LockEngine::in_memory())
        .key(ScopedKey::new("x-tenant", IdempotencyKey::new()))
        .build()
        .unwrap()
}

async fn held_key(Extension(info): Extension<LeaseInfo>) -> String {
    info.key().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_longest_key_locks_under_a_long_tenant_on_axum() {
    let app = axum::Router::new()
        .route("/orders", post(held_key))
        .layer(tenant_layer());
    let server = serve(app).await;
    let (status, a) = order(&server, &long_scope('a')).await;
    assert_eq!(status, StatusCode::OK, "{a}");
    let (status, b) = order(&server, &long_scope('b')).await;
    assert_eq!(status, StatusCode::OK, "{b}");
    assert_ne!(a, b, "two tenants, two locks");
    assert!(a.len() <= tower_lock::engine::MAX_KEY_LEN, "{}", a.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_longest_key_locks_under_a_long_tenant_on_actix() {
    let middleware = LockMiddleware::try_from(tenant_layer()).unwrap();
    let server = serve_actix(ACTIX_WORKERS, move || {
        actix_web::App::new().service(
            actix_web::web::resource("/orders")
                .wrap(middleware.clone())
                .route(actix_web::web::post().to(|| async { "ok" })),
        )
    });
    for last in ['a', 'b'] {
        let (status, body) = order(&server, &long_scope(last)).await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
}

/// What an authentication layer puts in the extensions.
#[derive(Clone)]
struct Principal(String);

impl fmt::Display for Principal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The test's authentication layer: the principal is the `x-tenant` header.
async fn authenticate(mut req: Request, next: Next) -> Response {
    let principal = req.headers()["x-tenant"].to_str().unwrap().to_owned();
    req.extensions_mut().insert(Principal(principal));
    next.run(req).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_longest_key_locks_per_long_principal_without_replay() {
    let layer = IdempotencyLayer::builder(LockEngine::in_memory())
        .per_principal::<Principal>()
        .without_replay()
        .build()
        .unwrap();
    let app = axum::Router::new()
        .route("/orders", post(held_key))
        .layer(layer)
        .layer(axum::middleware::from_fn(authenticate));
    let server = serve(app).await;
    let (status, a) = order(&server, &long_scope('a')).await;
    assert_eq!(status, StatusCode::OK, "{a}");
    let (_, b) = order(&server, &long_scope('b')).await;
    assert_ne!(a, b, "two principals, two locks");
}
