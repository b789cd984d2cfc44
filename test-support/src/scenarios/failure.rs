//! What a request is answered when the backend cannot be reached, per failure policy.

use std::{sync::Arc, time::Duration};

use http::StatusCode;
use tower_lock::{BackendFailurePolicy, LockEngine, LockLayer};

use super::{FOR_K, Framework, header_key, inside, post_refused};
use crate::{gate::GateControl, http::TestServer, unavailable::UnavailableBackend};

/// `POST /work` (gated) under a layer on a backend that is always down, with `policy`
/// (and a `Retry-After` fallback of 4.2 s); the layer, the server, the gate's control.
async fn serve_unavailable(
    framework: Framework,
    policy: BackendFailurePolicy,
) -> (LockLayer, Arc<TestServer>, GateControl) {
    let layer = LockLayer::builder(LockEngine::new(UnavailableBackend))
        .key(header_key())
        .on_backend_failure(policy)
        .retry_after_fallback(Duration::from_millis(4_200))
        .build()
        .unwrap();
    let (server, control) = framework.serve_gated(&layer).await;
    (layer, server, control)
}

/// By default a request the backend cannot lock is refused `503`, with the configured
/// fallback `Retry-After` (rounded to the nearest whole second).
pub async fn unavailable_backend_fails_closed_with_503_and_retry_after(framework: Framework) {
    let closed = BackendFailurePolicy::default();
    let (_, server, control) = serve_unavailable(framework, closed).await;
    control.open();
    let reply = server.post("/work", FOR_K).await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(reply.header("retry-after"), Some("4"));
    let problem = reply.json();
    assert_eq!(problem["type"], "urn:tower-lock:problem:lock-unavailable");
}

/// Under [`BackendFailurePolicy::FailOpen`] requests run unlocked: two with one key at
/// the same time.
pub async fn unavailable_backend_fails_open_when_configured(framework: Framework) {
    let open = BackendFailurePolicy::FailOpen;
    let (layer, server, mut control) = serve_unavailable(framework, open).await;
    let a = inside(&server, "/work", FOR_K, &mut control).await;
    let b = inside(&server, "/work", FOR_K, &mut control).await;
    control.open();
    assert_eq!(a.await.unwrap().text(), "unlocked");
    assert_eq!(b.await.unwrap().text(), "unlocked");
    assert_eq!(layer.metrics().snapshot().unlocked, 2);
}

/// Under [`BackendFailurePolicy::Degrade`] requests lock on an in-process engine: one
/// key still runs one at a time on this node.
pub async fn unavailable_backend_degrades_to_an_in_process_lock_when_configured(
    framework: Framework,
) {
    let degrade = BackendFailurePolicy::Degrade;
    let (layer, server, mut control) = serve_unavailable(framework, degrade).await;
    let a = inside(&server, "/work", FOR_K, &mut control).await;
    let b = post_refused(&server, "/work", FOR_K, &mut control).await;
    assert_eq!(b.status, StatusCode::LOCKED);
    control.open();
    assert!(a.await.unwrap().text().starts_with("degraded:"));
    assert_eq!(layer.metrics().snapshot().degraded, 1);
}
