//! Any legal key works under any scope: a long scope (an issuer URL and a subject) is
//! reduced to a digest inside the lock key, so a 255-character `Idempotency-Key` (the
//! documented maximum) is never turned into a `400` by the server's own scope.

use std::{fmt, sync::atomic::Ordering, time::Duration};

use axum::{extract::Request, middleware::Next, response::Response, routing::post};
use http::StatusCode;
use tokio::time::{Instant, sleep};
use tower_lock::{
    IdempotencyLayer,
    key::{HeaderKey, MAX_IDEMPOTENCY_KEY_LEN},
};

use super::app::{created, replay_app};
use crate::{
    http::{Reply, TestServer, serve},
    scenarios::{Backend, Framework, LockTable, Stack},
};

/// A principal as an OpenID provider names it: the issuer URL and the subject, about 240
/// characters. `last` ends it, so that two principals differ only in their last character.
fn long_principal(last: char) -> String {
    let issuer = "https://login.identity-provider.example.com/7f3e2c1a-9b8d-4e6f-a5c4-3b2a1f0e9d8c/oauth2/v2.0";
    let subject =
        "service-account/payments-reconciliation-worker/eu-west-1/instance-0042/".repeat(2);
    let principal = format!("{issuer}|{subject}{last}");
    assert!(
        (230..=260).contains(&principal.len()),
        "{}",
        principal.len()
    );
    principal
}

/// An idempotency key of the documented maximum length, of printable ASCII with the
/// characters that mean something elsewhere (`/`, `%`, `{`, `}`, `:`, `|`).
fn longest_key() -> String {
    let key: String = "order/%7B{x}:|-"
        .chars()
        .cycle()
        .take(MAX_IDEMPOTENCY_KEY_LEN)
        .collect();
    assert_eq!(key.len(), MAX_IDEMPOTENCY_KEY_LEN);
    key
}

/// `POST /orders` with idempotency key `key` on behalf of `principal` (in the header the
/// scope reads).
async fn order(server: &TestServer, principal: &str, key: &str) -> Reply {
    let key = format!("\"{key}\"");
    server
        .send_body(
            "POST",
            "/orders",
            &[
                ("idempotency-key", key.as_str()),
                ("x-principal", principal),
            ],
            "{\"sku\":42}",
        )
        .await
}

/// Wait (bounded) until the record of `key` within `scope` is stored.
async fn until_recorded(table: &LockTable, layer: &IdempotencyLayer, scope: &str, key: &str) {
    let record = layer
        .record_key(Some(scope), key)
        .expect("a legal key under any scope has a record key");
    let give_up = Instant::now() + Duration::from_secs(10);
    while table.engine().record(&record).await.unwrap().is_none() {
        assert!(
            Instant::now() < give_up,
            "no record for {key} within {scope}"
        );
        sleep(Duration::from_millis(2)).await;
    }
}

/// A 240-character scope and a 255-character key: the request runs (not `400`), its retry
/// is replayed, and a principal that differs only in its last character runs its own.
pub async fn the_longest_key_works_under_a_long_scope(on: Stack) {
    let table = on.table("replay-long-scope").await;
    // The scope a gateway vouches for (it strips the header from what clients send).
    let layer = IdempotencyLayer::builder(table.engine())
        .scope_by(HeaderKey::new("x-principal"))
        .build()
        .unwrap();
    let app = replay_app(on, layer.clone()).await;
    let (alice, bob, key) = (long_principal('a'), long_principal('b'), longest_key());
    let first = order(&app.server, &alice, &key).await;
    assert_eq!(
        first.status,
        StatusCode::CREATED,
        "a legal key under a long scope was answered {} {:?}",
        first.status,
        first.text()
    );
    until_recorded(&table, &layer, &alice, &key).await;
    let retry = order(&app.server, &alice, &key).await;
    assert_eq!(retry.header("idempotent-replayed"), Some("true"));
    let other = order(&app.server, &bob, &key).await;
    assert_eq!(
        (other.status, other.header("idempotent-replayed")),
        (StatusCode::CREATED, None),
        "another principal runs its own request"
    );
    assert_eq!(app.runs.load(Ordering::SeqCst), 2);
}

/// What an authentication layer puts in the request extensions: an issuer and a subject.
#[derive(Clone, Debug)]
struct Principal(String);

impl fmt::Display for Principal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The authentication layer of the test: the principal is the `x-principal` header.
async fn authenticate(mut req: Request, next: Next) -> Response {
    let principal = req
        .headers()
        .get("x-principal")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    if let Some(principal) = principal {
        req.extensions_mut().insert(Principal(principal));
    }
    next.run(req).await
}

/// `per_principal` with a 240-character principal and a 255-character key: the request
/// runs and its retry is replayed. (Tower only: actix requests carry no `http` extensions,
/// and `scope_by` is covered on both frameworks.)
pub async fn the_longest_key_works_per_long_principal(backend: Backend) {
    let on = Stack::new(Framework::Tower, backend);
    let table = on.table("replay-long-principal").await;
    let layer = IdempotencyLayer::builder(table.engine())
        .per_principal::<Principal>()
        .build()
        .unwrap();
    let runs = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let orders = {
        let runs = runs.clone();
        move |body: String| {
            let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
            async move { created(n, &body) }
        }
    };
    let app = axum::Router::new()
        .route("/orders", post(orders))
        .layer(layer.clone())
        .layer(axum::middleware::from_fn(authenticate));
    let server = serve(app).await;
    let (principal, key) = (long_principal('a'), longest_key());
    let first = order(&server, &principal, &key).await;
    assert_eq!(
        first.status,
        StatusCode::CREATED,
        "a legal key of a long principal was answered {} {:?}",
        first.status,
        first.text()
    );
    until_recorded(&table, &layer, &principal, &key).await;
    let retry = order(&server, &principal, &key).await;
    assert_eq!(retry.header("idempotent-replayed"), Some("true"));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}
