//! The tower layer (under axum) and the actix middleware, built from one configuration on
//! one engine, answer alike: the same status, headers and problem document.

use std::{sync::Arc, time::Duration};

use bytes::Bytes;
use http::StatusCode;
use tower_lock::{IdempotencyLayer, LockLayerBuilder};

use super::{Backend, FOR_K, Framework, Handler, Routes, hold, lock_key, wait_for_waiters};
use crate::{
    gate::{GateControl, gate},
    http::{Reply, TestServer},
};

/// `POST /work` under a layer built from one configuration, served by the tower layer and
/// by the actix middleware; both handlers pass one open gate, so the test sees whether
/// any ran.
struct Both {
    tower: Arc<TestServer>,
    actix: Arc<TestServer>,
    gate: GateControl,
}

impl Both {
    async fn serve(make: impl Fn() -> LockLayerBuilder) -> Self {
        let (gate, control) = gate();
        control.open();
        let serve = |framework: Framework| {
            let layer = make().build().unwrap();
            framework.serve(Routes::new().post("/work", &layer, Handler::Gated(gate.clone())))
        };
        Self {
            tower: serve(Framework::Tower).await,
            actix: serve(Framework::Actix).await,
            gate: control,
        }
    }

    /// `POST /work` with `headers`, to the tower layer, then to the actix middleware.
    async fn post(&self, headers: &[(&str, &str)]) -> (Reply, Reply) {
        let tower = self.tower.post("/work", headers).await;
        let actix = self.actix.post("/work", headers).await;
        (tower, actix)
    }
}

fn assert_same_rejection(tower: &Reply, actix: &Reply, status: StatusCode) {
    assert_eq!(tower.status, status, "tower: {}", tower.text());
    assert_eq!(actix.status, status, "actix: {}", actix.text());
    for name in ["content-type", "retry-after"] {
        assert_eq!(tower.header(name), actix.header(name), "{name}");
    }
    assert_eq!(
        actix.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(tower.json(), actix.json());
}

/// A held key: `423` with the same `Retry-After` on both (the fallback, 1 s: neither has
/// observed a hold yet, and the holder's 10 s lease is not what a client should wait).
pub async fn held_key_is_answered_423_like_the_tower_layer(backend: Backend) {
    let table = backend.table("parity-locked").await;
    let both = Both::serve(|| table.layer()).await;
    let held = hold(&table.engine(), &lock_key("k")).await;
    let (t, a) = both.post(FOR_K).await;
    assert_same_rejection(&t, &a, StatusCode::LOCKED);
    assert_eq!(a.header("retry-after"), Some("1"));
    assert_eq!(a.json()["type"], "urn:tower-lock:problem:locked");
    // Another key is free.
    let other = both.actix.post("/work", &[("x-key", "j")]).await;
    assert_eq!(other.status, StatusCode::OK);
    held.release().await.unwrap();
    assert_eq!(both.actix.post("/work", FOR_K).await.status, StatusCode::OK);
}

/// A wait that runs out: `429` on both, the same document but for how long each waited.
pub async fn wait_that_runs_out_is_answered_429_like_the_tower_layer(backend: Backend) {
    let table = backend.table("parity-timed-out").await;
    let mut both = Both::serve(|| table.layer().wait(Duration::from_millis(100))).await;
    let held = hold(&table.engine(), &lock_key("k")).await;
    let (t, a) = both.post(FOR_K).await;
    // The detail says how long each waited, to the millisecond; everything else matches.
    let (mut tj, mut aj) = (t.json(), a.json());
    assert!(aj["detail"].as_str().unwrap().starts_with("waited "));
    tj["detail"] = "".into();
    aj["detail"] = "".into();
    assert_eq!(tj, aj);
    assert_eq!(t.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(a.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(t.header("retry-after"), a.header("retry-after"));
    assert_eq!(aj["type"], "urn:tower-lock:problem:wait-timed-out");
    let retry: u64 = a.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=10).contains(&retry), "Retry-After {retry}");
    assert_eq!(both.gate.try_arrived(), None, "no handler ran while held");
    held.release().await.unwrap();
    assert_eq!(both.actix.post("/work", FOR_K).await.status, StatusCode::OK);
}

/// A full wait queue: `429` at once on both.
pub async fn full_wait_queue_is_answered_429_like_the_tower_layer(backend: Backend) {
    let table = backend.table("parity-queue-full").await;
    let engine = table.engine();
    let both = Both::serve(|| {
        let layer = table.layer().wait(Duration::from_secs(10));
        layer.max_waiters(1)
    })
    .await;
    let held = hold(&engine, &lock_key("k")).await;
    // One waiter fills the queue of the key.
    let waiter = tokio::spawn({
        let lock = engine.lock(lock_key("k")).wait(Duration::from_secs(10));
        async move { lock.acquire().await }
    });
    wait_for_waiters(&engine, &lock_key("k"), 1).await;
    let (t, a) = both.post(FOR_K).await;
    assert_same_rejection(&t, &a, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(a.json()["type"], "urn:tower-lock:problem:too-many-waiters");
    held.release().await.unwrap();
    waiter.await.unwrap().unwrap().release().await.unwrap();
}

/// The idempotency preset: a missing key, a malformed key and a duplicate are answered
/// alike on both.
pub async fn idempotency_preset_answers_400_and_409_like_the_tower_layer(backend: Backend) {
    let table = backend.table("parity-idempotency").await;
    let both = Both::serve(|| IdempotencyLayer::builder(table.engine()).without_replay()).await;

    let (t, a) = both.post(&[]).await;
    assert_same_rejection(&t, &a, StatusCode::BAD_REQUEST);
    assert_eq!(a.json()["type"], "urn:tower-lock:problem:missing-key");
    assert_eq!(a.header("retry-after"), None);

    let (t, a) = both.post(&[("idempotency-key", "\"unterminated")]).await;
    assert_same_rejection(&t, &a, StatusCode::BAD_REQUEST);
    assert_eq!(a.json()["type"], "urn:tower-lock:problem:malformed-key");

    let order_1 = tower_lock::key::encode("", "idempotency-key", "order-1");
    let _held = hold(&table.engine(), &order_1).await;
    let t = both
        .tower
        .post("/work", &[("idempotency-key", "\"order-1\"")])
        .await;
    let a = both
        .actix
        .post("/work", &[("idempotency-key", "order-1")])
        .await;
    assert_same_rejection(&t, &a, StatusCode::CONFLICT);
    assert_eq!(a.json()["type"], "urn:tower-lock:problem:conflict");

    let order_2 = [("idempotency-key", "\"order-2\"")];
    assert_eq!(
        both.actix.post("/work", &order_2).await.status,
        StatusCode::OK
    );
}

/// A rejection hook's response is sent as built, on both.
pub async fn rejection_hook_answers_on_actix_as_on_the_tower_layer(backend: Backend) {
    let table = backend.table("parity-hook").await;
    let both = Both::serve(|| {
        table.layer().on_reject(|rejection| {
            let body = Bytes::from(format!("busy: {}\n", rejection.kind()));
            let mut res = http::Response::new(body);
            *res.status_mut() = rejection.status();
            let headers = res.headers_mut();
            headers.insert("content-type", "text/plain".parse().unwrap());
            headers.insert("x-lock", "held".parse().unwrap());
            res
        })
    })
    .await;
    let _held = table.engine().lock(lock_key("k")).acquire().await.unwrap();
    let (t, a) = both.post(FOR_K).await;
    assert_eq!(a.status, StatusCode::LOCKED);
    assert_eq!(t.status, a.status);
    for name in ["content-type", "x-lock"] {
        assert_eq!(t.header(name), a.header(name), "{name}");
    }
    assert_eq!(a.text(), "busy: locked\n");
    assert_eq!(t.body, a.body);
}
