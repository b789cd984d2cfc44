//! What the scenarios' client does and checks: requests in the background, requests that
//! must be refused, the problem document of a rejection, and the state of a key.

use std::{sync::Arc, time::Duration};

use http::{HeaderName, StatusCode};
use tokio::task::JoinHandle;
use tower_lock::{Lease, LockEngine, key::HeaderKey};

use crate::{
    gate::GateControl,
    http::{Reply, TestServer},
};

/// The headers of a request for the key `k` (under [`header_key`]).
pub const FOR_K: &[(&str, &str)] = &[("x-key", "k")];

/// The key extractor of most scenarios: the `x-key` header.
pub fn header_key() -> HeaderKey {
    HeaderKey::new(HeaderName::from_static("x-key"))
}

/// The lock key of a request with `x-key: <value>` to a layer keyed on [`header_key`]
/// without a namespace.
pub fn lock_key(value: &str) -> String {
    tower_lock::key::encode(
        "",
        tower_lock::key::KeyExtractor::kind(&header_key()),
        value,
    )
}

/// The lock key of a request with `idempotency-key: <value>` to the idempotency preset.
pub fn idempotency_lock_key(value: &str) -> String {
    tower_lock::key::encode("", "idempotency-key", value)
}

/// `POST path` with `headers`, sent in the background.
pub fn spawn_post(
    server: &Arc<TestServer>,
    path: &'static str,
    headers: &[(&str, &str)],
) -> JoinHandle<Reply> {
    let server = server.clone();
    let headers: Vec<(String, String)> = headers
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    tokio::spawn(async move {
        let headers: Vec<(&str, &str)> = headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        server.post(path, &headers).await
    })
}

/// Wait until a handler arrives at the gate and return its label; if `request` is answered
/// first, fail with its answer.
pub async fn arrives(control: &mut GateControl, request: &mut JoinHandle<Reply>) -> String {
    tokio::select! {
        who = control.arrived() => who,
        reply = request => {
            let reply = reply.unwrap();
            panic!("answered {} before reaching the handler: {}", reply.status, reply.text())
        }
    }
}

/// `POST path` with `headers`, sent in the background, once its handler is inside (waiting
/// at the gate); fails at once if the request is answered instead.
pub async fn inside(
    server: &Arc<TestServer>,
    path: &'static str,
    headers: &[(&str, &str)],
    control: &mut GateControl,
) -> JoinHandle<Reply> {
    let mut request = spawn_post(server, path, headers);
    arrives(control, &mut request).await;
    request
}

/// Wait until the handler of `request` reports `who` at the gate; fail at once if the
/// request is answered instead (refused by its layer).
pub async fn reaches_its_handler(
    control: &mut GateControl,
    request: &mut JoinHandle<Reply>,
    who: &str,
) {
    assert_eq!(arrives(control, request).await, who);
}

/// `POST path` with `headers` while another request with the same key is inside the
/// handler: answered without entering the handler (fails at once if it does enter).
pub async fn post_refused(
    server: &Arc<TestServer>,
    path: &'static str,
    headers: &[(&str, &str)],
    control: &mut GateControl,
) -> Reply {
    let mut request = spawn_post(server, path, headers);
    tokio::select! {
        reply = &mut request => reply.unwrap(),
        _ = control.arrived() => panic!("a second request with the same key entered the handler"),
    }
}

/// Hold `key` for 10 s, as another request would (panics if it is not free).
pub async fn hold(engine: &LockEngine, key: &str) -> Lease {
    engine
        .lock(key)
        .ttl(Duration::from_secs(10))
        .try_acquire()
        .await
        .unwrap_or_else(|e| panic!("{key} is free: {e}"))
}

/// Wait until `n` waiters queue on `key`.
pub async fn wait_for_waiters(engine: &LockEngine, key: &str, n: usize) {
    tokio::time::timeout(Duration::from_secs(10), async {
        // The engine offers no event for "a waiter queued"; look again shortly.
        while engine.lock(key).waiters().await.unwrap() < n {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{n} waiters queue on {key} within 10 s"));
}

/// Check a rejection: `status`, `Retry-After` (whole seconds, at least 1) and an
/// `application/problem+json` body of type `urn:tower-lock:problem:<kind>` that agrees.
/// Returns the `Retry-After` seconds.
pub fn assert_problem(reply: &Reply, status: StatusCode, kind: &str) -> u64 {
    assert_eq!(reply.status, status, "{}", reply.text());
    assert_eq!(
        reply.header("content-type"),
        Some("application/problem+json")
    );
    let retry: u64 = reply
        .header("retry-after")
        .expect("a Retry-After header")
        .parse()
        .expect("Retry-After in whole seconds");
    assert!(retry >= 1, "Retry-After {retry}");
    let problem = reply.json();
    assert_eq!(problem["type"], format!("urn:tower-lock:problem:{kind}"));
    assert_eq!(problem["status"], status.as_u16());
    assert_eq!(problem["retry_after"], retry);
    assert!(problem["title"].is_string() && problem["detail"].is_string());
    retry
}

/// Wait (event-driven) until the lease of a finished request is released, which happens in
/// the background once its body ends: take the key and give it back.
pub async fn until_free(engine: &LockEngine, key: &str) {
    engine
        .lock(key)
        .wait(Duration::from_secs(5))
        .acquire()
        .await
        .unwrap_or_else(|e| panic!("{key} is free within 5 s: {e}"))
        .release()
        .await
        .unwrap();
}
