//! What a request that cannot run is answered, and which requests share a key.

use std::time::Duration;

use http::StatusCode;
use tokio::{io::AsyncReadExt, time::Instant};
use tower_lock::{
    IdempotencyLayer, LockLayer, MissingKeyPolicy,
    key::{GlobalKey, IdempotencyKey, ScopedKey},
};

use super::{
    FOR_K, Handler, Routes, Stack, assert_problem, idempotency_lock_key, inside, lock_key,
    post_refused, reaches_its_handler, spawn_post, until_free, wait_for_waiters,
};
use crate::gate::gate;

/// A request for a key another request holds is answered `423` at once, with a
/// `Retry-After` from the holder's remaining TTL and a problem document; other keys run.
pub async fn held_key_is_answered_423_with_retry_after_and_problem_json(on: Stack) {
    let table = on.table("locked").await;
    let layer = table.layer().ttl(Duration::from_millis(2_500));
    let (server, mut control) = on.serve_gated(&layer.build().unwrap()).await;

    let first = inside(&server, "/work", FOR_K, &mut control).await;
    let second = post_refused(&server, "/work", FOR_K, &mut control).await;
    // Retry-After comes from the holder's remaining TTL (at most 2.5 s).
    let retry = assert_problem(&second, StatusCode::LOCKED, "locked");
    assert!((1..=3).contains(&retry), "Retry-After {retry}");

    // Another key is not affected.
    let other = inside(&server, "/work", &[("x-key", "other")], &mut control).await;
    control.open();
    for reply in [first.await.unwrap(), other.await.unwrap()] {
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
        assert!(reply.text().starts_with("fence:"), "{}", reply.text());
    }
    let keys = [lock_key("k"), lock_key("other")];
    table.assert_no_residue(&keys).await;
}

/// A request that waits for a held key longer than its layer allows is answered `429`,
/// and leaves the queue.
pub async fn wait_that_runs_out_is_answered_429_with_retry_after(on: Stack) {
    let table = on.table("timed-out").await;
    let layer = table.layer().wait(Duration::from_millis(150));
    let (server, mut control) = on.serve_gated(&layer.build().unwrap()).await;
    let first = inside(&server, "/work", FOR_K, &mut control).await;
    let started = Instant::now();
    let second = post_refused(&server, "/work", FOR_K, &mut control).await;
    assert!(started.elapsed() >= Duration::from_millis(150), "it waited");
    assert_problem(&second, StatusCode::TOO_MANY_REQUESTS, "wait-timed-out");
    // The waiter that gave up left the queue.
    let waiters = table.engine().lock(lock_key("k")).waiters().await.unwrap();
    assert_eq!(waiters, 0);
    control.open();
    assert_eq!(first.await.unwrap().status, StatusCode::OK);
    table.assert_no_residue(&[lock_key("k")]).await;
}

/// A request that finds the key's wait queue full is answered `429` at once.
pub async fn full_wait_queue_is_answered_429_at_once(on: Stack) {
    let table = on.table("queue-full").await;
    let layer = table.layer().wait(Duration::from_secs(20)).max_waiters(1);
    let (server, mut control) = on.serve_gated(&layer.build().unwrap()).await;
    let first = inside(&server, "/work", FOR_K, &mut control).await;
    let waiting = spawn_post(&server, "/work", FOR_K);
    wait_for_waiters(&table.engine(), &lock_key("k"), 1).await;
    let started = Instant::now();
    let third = post_refused(&server, "/work", FOR_K, &mut control).await;
    assert_problem(&third, StatusCode::TOO_MANY_REQUESTS, "too-many-waiters");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "answered at once, not after a wait: {:?}",
        started.elapsed()
    );
    control.open();
    assert_eq!(first.await.unwrap().status, StatusCode::OK);
    assert_eq!(waiting.await.unwrap().status, StatusCode::OK);
    table.assert_no_residue(&[lock_key("k")]).await;
}

/// A request without a key is refused `400` (no `Retry-After`: trying again will not
/// help), or runs unlocked under [`MissingKeyPolicy::PassThrough`].
pub async fn missing_key_is_400_or_passes_through_as_configured(on: Stack) {
    let table = on.table("missing-key").await;
    let reject = table.layer().build().unwrap();
    let pass = table.layer().on_missing_key(MissingKeyPolicy::PassThrough);
    let (gate, control) = gate();
    control.open();
    let routes = Routes::new()
        .post("/reject", &reject, Handler::Gated(gate.clone()))
        .post("/pass", &pass.build().unwrap(), Handler::Gated(gate));
    let server = on.serve(routes).await;
    let reply = server.post("/reject", &[]).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(reply.json()["type"], "urn:tower-lock:problem:missing-key");
    assert!(reply.header("retry-after").is_none());

    let reply = server.post("/pass", &[]).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.text(), "unlocked");
    let locked = server.post("/pass", FOR_K).await;
    assert!(locked.text().starts_with("fence:"));
    table.assert_no_residue(&[lock_key("k")]).await;
}

/// The idempotency preset, scoped per tenant: a missing or malformed key is `400`, a
/// duplicate in flight (either spelling) is `409`, another tenant's identical key is
/// another lock.
pub async fn idempotency_preset_requires_a_wellformed_key_and_answers_duplicates_409(on: Stack) {
    let table = on.table("idempotency-scoped").await;
    let layer = IdempotencyLayer::builder(table.engine())
        .without_replay()
        .key(ScopedKey::new("x-tenant", IdempotencyKey::new()))
        .build()
        .unwrap();
    let (server, mut control) = on.serve_gated(&layer).await;

    let missing = server.post("/work", &[("x-tenant", "a")]).await;
    assert_eq!(missing.status, StatusCode::BAD_REQUEST);
    assert_eq!(missing.json()["type"], "urn:tower-lock:problem:missing-key");
    let long = "k".repeat(256);
    for bad in ["\"unterminated", "a\"b", long.as_str()] {
        let headers = [("x-tenant", "a"), ("idempotency-key", bad)];
        let reply = server.post("/work", &headers).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{bad}");
        assert_eq!(reply.json()["type"], "urn:tower-lock:problem:malformed-key");
    }

    let tenant_a = [("x-tenant", "a"), ("idempotency-key", "\"abc\"")];
    let first = inside(&server, "/work", &tenant_a, &mut control).await;
    // The bare form is the same key.
    let bare = [("x-tenant", "a"), ("idempotency-key", "abc")];
    let dup = post_refused(&server, "/work", &bare, &mut control).await;
    assert_problem(&dup, StatusCode::CONFLICT, "conflict");

    // Another tenant's identical key is another lock.
    let tenant_b = [("x-tenant", "b"), ("idempotency-key", "abc")];
    let other_tenant = inside(&server, "/work", &tenant_b, &mut control).await;
    control.open();
    assert_eq!(first.await.unwrap().status, StatusCode::OK);
    assert_eq!(other_tenant.await.unwrap().status, StatusCode::OK);
}

/// The idempotency preset: a duplicate in flight is `409`; once the first is done, the
/// same key runs again.
pub async fn idempotency_duplicate_in_flight_is_answered_409(on: Stack) {
    let table = on.table("idempotency").await;
    let layer = IdempotencyLayer::builder(table.engine())
        .without_replay()
        .build()
        .unwrap();
    let (server, mut control) = on.serve_gated(&layer).await;

    let missing = server.post("/work", &[]).await;
    assert_eq!(missing.status, StatusCode::BAD_REQUEST);
    assert_eq!(missing.json()["type"], "urn:tower-lock:problem:missing-key");

    let quoted = [("idempotency-key", "\"abc\"")];
    let first = inside(&server, "/work", &quoted, &mut control).await;
    // The bare form is the same key.
    let bare = [("idempotency-key", "abc")];
    let dup = post_refused(&server, "/work", &bare, &mut control).await;
    assert_problem(&dup, StatusCode::CONFLICT, "conflict");
    control.open();
    assert!(first.await.unwrap().text().starts_with("fence:"));
    // Done, not in flight: the same key runs again.
    until_free(&table.engine(), &idempotency_lock_key("abc")).await;
    let again = server.post("/work", &bare).await;
    assert_eq!(again.status, StatusCode::OK, "{}", again.text());
    let keys = [idempotency_lock_key("abc")];
    table.assert_no_residue(&keys).await;
}

/// A rejection hook replaces the problem document and keeps the status and headers.
pub async fn rejection_hook_replaces_the_default_body_and_keeps_the_headers(on: Stack) {
    let table = on.table("hook").await;
    let layer = table.layer().on_reject(|rejection| {
        let body = format!("custom {}", rejection.kind());
        let mut res = http::Response::new(bytes::Bytes::from(body));
        *res.status_mut() = rejection.status();
        for (name, value) in rejection.headers() {
            if name != "content-type" {
                res.headers_mut().insert(name, value.parse().unwrap());
            }
        }
        res
    });
    let (server, control) = on.serve_gated(&layer.build().unwrap()).await;
    control.open();
    let reply = server.post("/work", &[]).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(reply.text(), "custom missing-key");
}

/// A plain HTTP/1.1 client sees the `423` status line and the `Retry-After` header.
pub async fn raw_socket_sees_status_line_for_locked(on: Stack) {
    let table = on.table("raw-socket").await;
    let (server, mut control) = on.serve_gated(&table.layer().build().unwrap()).await;
    let first = inside(&server, "/work", FOR_K, &mut control).await;
    let mut stream = server
        .raw("POST /work HTTP/1.1\r\nhost: t\r\nx-key: k\r\nconnection: close\r\ncontent-length: 0\r\n\r\n")
        .await;
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await.unwrap();
    assert!(raw.starts_with("HTTP/1.1 423 Locked\r\n"), "{raw}");
    let lowercase = raw.to_ascii_lowercase();
    assert!(lowercase.contains("\r\nretry-after: "), "{raw}");
    control.open();
    assert_eq!(first.await.unwrap().status, StatusCode::OK);
    table.assert_no_residue(&[lock_key("k")]).await;
}

/// One layer on many routes is one lock table: a global key held on one route refuses the
/// other.
pub async fn one_layer_on_many_routes_shares_one_lock_table(on: Stack) {
    let table = on.table("many-routes").await;
    let layer = LockLayer::builder(table.engine())
        .key(GlobalKey::new("maintenance"))
        .build()
        .unwrap();
    let (gate, mut control) = gate();
    let routes = Routes::new()
        .post("/a", &layer, Handler::Gated(gate.clone()))
        .post("/b", &layer, Handler::Gated(gate));
    let server = on.serve(routes).await;
    let a = inside(&server, "/a", &[], &mut control).await;
    let b = post_refused(&server, "/b", &[], &mut control).await;
    assert_eq!(b.status, StatusCode::LOCKED);
    control.open();
    assert_eq!(a.await.unwrap().status, StatusCode::OK);
    let snap = layer.metrics().snapshot();
    assert_eq!((snap.acquired, snap.rejected.locked), (1, 1));
}

/// Keys are data, never syntax: `a` + `bX` and `ab` + `X` are two locks, not one.
pub async fn a_client_of_one_namespace_cannot_spell_a_key_of_another(on: Stack) {
    let table = on.table("namespaces").await;
    let layer = |namespace: &str| table.layer().namespace(namespace).build().unwrap();
    let (gate, mut control) = gate();
    let routes = Routes::new()
        .post("/a", &layer("a"), Handler::Gated(gate.clone()))
        .post("/ab", &layer("ab"), Handler::Gated(gate));
    let server = on.serve(routes).await;

    let mut first = spawn_post(&server, "/a", &[("x-key", "bX"), ("x-seq", "first")]);
    reaches_its_handler(&mut control, &mut first, "first").await;
    let mut second = spawn_post(&server, "/ab", &[("x-key", "X"), ("x-seq", "second")]);
    reaches_its_handler(&mut control, &mut second, "second").await;
    control.open();
    assert_eq!(first.await.unwrap().status, StatusCode::OK);
    assert_eq!(second.await.unwrap().status, StatusCode::OK);
}

/// A layer keyed on a plain header cannot take the idempotency preset's lock by sending
/// the preset's key words.
pub async fn a_plain_header_key_cannot_block_the_idempotency_preset(on: Stack) {
    let table = on.table("plain-vs-idempotency").await;
    let plain = table.layer().build().unwrap();
    let idempotent = IdempotencyLayer::builder(table.engine())
        .without_replay()
        .build()
        .unwrap();
    let (gate, mut control) = gate();
    let routes = Routes::new()
        .post("/plain", &plain, Handler::Gated(gate.clone()))
        .post("/orders", &idempotent, Handler::Gated(gate));
    let server = on.serve(routes).await;

    let squat = [("x-key", "idempotency-key:k"), ("x-seq", "plain")];
    let mut squatter = spawn_post(&server, "/plain", &squat);
    reaches_its_handler(&mut control, &mut squatter, "plain").await;
    let order = [("idempotency-key", "\"k\""), ("x-seq", "order")];
    let mut order = spawn_post(&server, "/orders", &order);
    reaches_its_handler(&mut control, &mut order, "order").await;
    control.open();
    assert_eq!(squatter.await.unwrap().status, StatusCode::OK);
    assert_eq!(order.await.unwrap().status, StatusCode::OK);
}
