//! What makes a retry the same request: a key reused with another body, path, query or
//! header value (or host, where the layer counts it) is a `422`, never the other request's
//! stored response; inside axum's nested routers the record is bound to the full original
//! target; a retry of the same request on another node of the fleet is replayed.

use std::sync::{
    Arc,
    atomic::{AtomicUsize, Ordering},
};

use axum::routing::post;
use http::StatusCode;

use super::{
    app::{created, replay_app},
    post_with, preset, until_recorded,
};
use crate::{
    http::serve,
    scenarios::{Framework, Stack, idempotency_lock_key},
};

/// One key reused with a different body, path or query is answered `422`, and the
/// handler does not run again.
pub async fn a_reused_key_with_another_request_is_422(on: Stack) {
    let table = on.table("replay-422").await;
    let app = replay_app(on, preset(&table).build().unwrap()).await;
    let first = post_with(&app.server, "/orders?x=1", "o2", "a").await;
    assert_eq!(first.status, StatusCode::CREATED);
    until_recorded(&table, "o2").await;
    for (path, body) in [
        ("/orders?x=1", "b"),
        ("/other?x=1", "a"),
        ("/orders?x=2", "a"),
        ("/orders", "a"),
    ] {
        let reply = post_with(&app.server, path, "o2", body).await;
        assert_eq!(
            reply.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{path} {body}"
        );
        assert_eq!(
            reply.json()["type"],
            "urn:tower-lock:problem:fingerprint-mismatch"
        );
        assert_eq!(reply.header("idempotent-replayed"), None);
    }
    assert_eq!(app.runs.load(Ordering::SeqCst), 1);
    table
        .assert_only_records(&[idempotency_lock_key("o2")], 1)
        .await;
}

/// Where the layer counts the host (`fingerprint_authority`), a key reused for the same
/// path on another host name is a `422`, not a replay of the other host's response.
pub async fn a_key_reused_on_another_host_is_422_where_the_host_counts(on: Stack) {
    let table = on.table("replay-host").await;
    let layer = preset(&table).fingerprint_authority().build().unwrap();
    let app = replay_app(on, layer).await;
    let send = |host: &'static str| {
        let server = app.server.clone();
        async move {
            server
                .send_body(
                    "POST",
                    "/orders",
                    &[("idempotency-key", "\"h1\""), ("host", host)],
                    "same",
                )
                .await
        }
    };
    let first = send("tenant-1.example").await;
    assert_eq!(first.status, StatusCode::CREATED);
    until_recorded(&table, "h1").await;
    let same_host = send("tenant-1.example").await;
    assert_eq!(same_host.header("idempotent-replayed"), Some("true"));
    let other = send("tenant-2.example").await;
    assert_eq!(
        other.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "another host was answered {} {:?}",
        other.status,
        other.text()
    );
    assert_eq!(app.runs.load(Ordering::SeqCst), 1);
}

/// Two nodes of one service (two servers, each at its own address, on one lock table): a
/// client's retry of the same request sent to the other node is replayed from the first
/// node's record, and the handler ran once. By default the host does not count.
pub async fn a_retry_on_another_node_is_replayed(on: Stack) {
    let table = on.table("replay-node").await;
    let one = replay_app(on, preset(&table).build().unwrap()).await;
    let two = replay_app(on, preset(&table).build().unwrap()).await;
    assert_ne!(one.server.addr(), two.server.addr());
    let first = post_with(&one.server, "/orders", "r1", "same").await;
    assert_eq!(first.status, StatusCode::CREATED);
    until_recorded(&table, "r1").await;
    let retry = post_with(&two.server, "/orders", "r1", "same").await;
    assert_eq!(
        retry.status,
        StatusCode::CREATED,
        "the retry on the other node was answered {} {:?}",
        retry.status,
        retry.text()
    );
    assert_eq!(retry.header("idempotent-replayed"), Some("true"));
    assert_eq!(retry.text(), first.text());
    let runs = one.runs.load(Ordering::SeqCst) + two.runs.load(Ordering::SeqCst);
    assert_eq!(runs, 1, "the handler ran {runs} times");
}

/// Every value of a fingerprinted header counts, in order: a retry that differs only in
/// a second value is a `422`.
pub async fn every_value_of_a_fingerprinted_header_counts(on: Stack) {
    let table = on.table("replay-values").await;
    let layer = preset(&table)
        .fingerprint_headers([http::HeaderName::from_static("x-scope")])
        .build()
        .unwrap();
    let app = replay_app(on, layer).await;
    let send = |second: &'static str| {
        let server = app.server.clone();
        async move {
            server
                .send_body(
                    "POST",
                    "/orders",
                    &[
                        ("idempotency-key", "\"v1\""),
                        ("x-scope", "read"),
                        ("x-scope", second),
                    ],
                    "same",
                )
                .await
        }
    };
    assert_eq!(send("write").await.status, StatusCode::CREATED);
    until_recorded(&table, "v1").await;
    assert_eq!(
        send("write").await.header("idempotent-replayed"),
        Some("true")
    );
    let other = send("admin").await;
    assert_eq!(
        other.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "a different second value was answered {} {:?}",
        other.status,
        other.text()
    );
    assert_eq!(app.runs.load(Ordering::SeqCst), 1);
}

/// Inside axum's nested routers the record is bound to the full original target: a key
/// reused on `/v2/orders` after `/v1/orders`, or by tenant 2 after tenant 1 under
/// `/tenants/{tenant}`, is a `422`, never the other route's stored response. (Tower only:
/// actix sees the full path already, which the host and path scenarios cover.)
pub async fn nested_routers_bind_records_to_the_full_target(backend: crate::scenarios::Backend) {
    let on = Stack::new(Framework::Tower, backend);
    let table = on.table("replay-nested").await;
    let runs = Arc::new(AtomicUsize::new(0));
    let orders = {
        let runs = runs.clone();
        move |body: String| {
            let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
            async move { created(n, &body) }
        }
    };
    let inner = axum::Router::new()
        .route("/orders", post(orders))
        .layer(preset(&table).build().unwrap());
    let app = axum::Router::new()
        .nest("/v1", inner.clone())
        .nest("/v2", inner.clone())
        .nest("/tenants/{tenant}", inner);
    let server = serve(app).await;
    for (first, second, k) in [
        ("/v1/orders", "/v2/orders", "n1"),
        ("/tenants/1/orders", "/tenants/2/orders", "n2"),
    ] {
        let one = post_with(&server, first, k, "same").await;
        assert_eq!(one.status, StatusCode::CREATED, "{first}");
        until_recorded(&table, k).await;
        let again = post_with(&server, first, k, "same").await;
        assert_eq!(again.header("idempotent-replayed"), Some("true"), "{first}");
        let other = post_with(&server, second, k, "same").await;
        assert_eq!(
            other.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{second} after {first} was answered {} {:?}",
            other.status,
            other.text()
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}
