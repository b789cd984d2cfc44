//! A custom fingerprint adds parts to the default one; it cannot take the default's parts
//! away. Even a hook that looks only at the method, the path a router sees and the body
//! keeps the query, the full original target and (where the layer counts it) the host in
//! the fingerprint.

use std::sync::{
    Arc,
    atomic::{AtomicUsize, Ordering},
};

use axum::routing::post;
use bytes::Bytes;
use http::StatusCode;
use tower_lock::key::RequestView;

use super::{
    app::{created, replay_app},
    post_with, preset, until_recorded,
};
use crate::{
    http::serve,
    scenarios::{Backend, Framework, Stack},
};

/// The hook an application might write: the method, the path it sees and the body, less
/// one trailing newline (what the `fingerprint_with` example once showed as a fingerprint
/// of its own).
fn method_path_body(req: &dyn RequestView, body: &[u8]) -> Bytes {
    let body = body.strip_suffix(b"\n").unwrap_or(body);
    let target = [req.method(), " ", req.path(), "\0"].concat();
    Bytes::from([target.as_bytes(), body].concat())
}

/// With a custom fingerprint, a real request after a `?dry_run=true` one with the same key
/// and body is `422`, not the dry run's replay; so is the same request sent to another
/// host, on a layer that counts the host. The request itself is still replayed.
pub async fn a_custom_fingerprint_keeps_the_query_and_the_host(on: Stack) {
    let table = on.table("replay-custom-fp").await;
    let layer = preset(&table)
        .fingerprint_with(method_path_body)
        .fingerprint_authority()
        .build()
        .unwrap();
    let app = replay_app(on, layer).await;
    let dry_run = post_with(&app.server, "/orders?dry_run=true", "c1", "{}").await;
    assert_eq!(dry_run.status, StatusCode::CREATED);
    until_recorded(&table, "c1").await;
    let again = post_with(&app.server, "/orders?dry_run=true", "c1", "{}").await;
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    let real = post_with(&app.server, "/orders", "c1", "{}").await;
    assert_eq!(
        real.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "the real request after the dry run was answered {} {:?}",
        real.status,
        real.text()
    );
    let other_host = app
        .server
        .send_body(
            "POST",
            "/orders?dry_run=true",
            &[("idempotency-key", "\"c1\""), ("host", "tenant-2.example")],
            "{}",
        )
        .await;
    assert_eq!(
        other_host.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "another host was answered {} {:?}",
        other_host.status,
        other_host.text()
    );
    assert_eq!(app.runs.load(Ordering::SeqCst), 1);
}

/// With a custom fingerprint inside a router nested under `/tenants/{tenant}`, tenant 2
/// reusing tenant 1's key and body is `422`, never tenant 1's stored order. (Tower only:
/// actix sees the full path.)
pub async fn a_custom_fingerprint_in_a_nested_router_keeps_the_full_target(backend: Backend) {
    let on = Stack::new(Framework::Tower, backend);
    let table = on.table("replay-custom-nested").await;
    let runs = Arc::new(AtomicUsize::new(0));
    let orders = {
        let runs = runs.clone();
        move |body: String| {
            let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
            async move { created(n, &body) }
        }
    };
    let layer = preset(&table)
        .fingerprint_with(method_path_body)
        .build()
        .unwrap();
    let inner = axum::Router::new()
        .route("/orders", post(orders))
        .layer(layer);
    let server = serve(axum::Router::new().nest("/tenants/{tenant}", inner)).await;
    let one = post_with(&server, "/tenants/1/orders", "t1", "{\"sku\":1}").await;
    assert_eq!(one.status, StatusCode::CREATED);
    until_recorded(&table, "t1").await;
    let two = post_with(&server, "/tenants/2/orders", "t1", "{\"sku\":1}").await;
    assert_eq!(
        two.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "tenant 2 was answered {} {:?}",
        two.status,
        two.text()
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}
