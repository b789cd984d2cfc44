//! The dry run (`dry_run(true)`): over a real socket, every request runs, and the layer's
//! metrics count what it would have done (rejected, waited, replayed); its leases never
//! meet a layer that enforces on the same keys.

use std::sync::{
    Arc,
    atomic::{AtomicUsize, Ordering},
};

use axum::{Router, routing::post};
use http::StatusCode;
use tokio::time::Duration;
use tower_lock::{IdempotencyLayer, LockEngine, LockLayer, key::HeaderKey};
use tower_lock_test_support::{
    gate::{GateControl, gate},
    http::{TestServer, serve},
};

/// `/jobs` under a dry-run layer keyed on `x-tenant-id` (waiting up to `wait`), and
/// `/enforced` under a real one on the same engine and keys; both handlers wait at the
/// gate.
async fn jobs(engine: &LockEngine, wait: Duration) -> (TestServer, GateControl, LockLayer) {
    let (gate, control) = gate();
    let handler = move || {
        let gate = gate.clone();
        async move {
            let _inside = gate.pass("job".to_owned()).await;
            "done"
        }
    };
    let tenant = || LockLayer::builder(engine.clone()).key(HeaderKey::new("x-tenant-id"));
    let observing = tenant().wait(wait).dry_run(true).build().unwrap();
    let enforcing = tenant().metrics_name("enforced").build().unwrap();
    let app = Router::new()
        .route("/jobs", post(handler.clone()))
        .route_layer(observing.clone())
        .merge(
            Router::new()
                .route("/enforced", post(handler))
                .route_layer(enforcing),
        );
    (serve(app).await, control, observing)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_rejects_nothing_and_counts_what_it_would_have_rejected() {
    let engine = LockEngine::in_memory();
    let (server, mut control, layer) = jobs(&engine, Duration::ZERO).await;
    let acme = [("x-tenant-id", "acme")];
    let first = server.post("/jobs", &acme);
    let second = server.post("/jobs", &acme);
    let enforced = server.post("/enforced", &acme);
    let others = async {
        // All three are inside their handler at once: the dry run held acme for the
        // first, would have answered the second 423, and the enforcing layer never met it.
        for _ in 0..3 {
            control.arrived().await;
        }
        assert_eq!(control.inside(), 3);
        control.open();
    };
    let (first, second, enforced, ()) = tokio::join!(first, second, enforced, others);
    for reply in [first, second, enforced] {
        assert_eq!(reply.status, StatusCode::OK);
    }
    // Without a key: it runs, counted as the 400 it would have been.
    assert_eq!(server.post("/jobs", &[]).await.status, StatusCode::OK);
    let snap = layer.metrics().snapshot();
    assert_eq!(snap.acquired, 1);
    assert_eq!(snap.rejected.locked, 1);
    assert_eq!(snap.rejected.missing_key, 1);
    assert_eq!(snap.contended, 1);
    assert_eq!(snap.contended_keys.len(), 1);
    assert!(snap.contended_keys[0].0.starts_with("%!dry-run/"));
    // Nothing left behind on the real keys, nor on the dry run's.
    assert!(
        !engine
            .lock("/header=x-tenant-id/acme")
            .locked()
            .await
            .unwrap()
    );
    let shadow = layer.locker().key_for("acme").unwrap();
    assert!(!engine.lock_on(shadow).locked().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_never_waits_and_counts_what_would_have_waited() {
    let engine = LockEngine::in_memory();
    let (server, mut control, layer) = jobs(&engine, Duration::from_secs(30)).await;
    let acme = [("x-tenant-id", "acme")];
    let first = server.post("/jobs", &acme);
    let second = server.post("/jobs", &acme);
    let others = async {
        // The second does not wait the 30 s for the first: both are inside at once.
        control.arrived().await;
        control.arrived().await;
        control.open();
    };
    let (first, second, ()) = tokio::join!(first, second, others);
    assert_eq!(
        (first.status, second.status),
        (StatusCode::OK, StatusCode::OK)
    );
    let snap = layer.metrics().snapshot();
    assert_eq!((snap.acquired, snap.contended), (1, 1));
    assert_eq!(snap.rejected.total(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotency_dry_run_runs_every_retry_and_counts_what_it_would_have_replayed() {
    let runs = Arc::new(AtomicUsize::new(0));
    let layer = IdempotencyLayer::builder(LockEngine::in_memory())
        .unscoped()
        .dry_run(true)
        .build()
        .unwrap();
    let app = Router::new()
        .route(
            "/charges",
            post({
                let runs = runs.clone();
                move || async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    (StatusCode::CREATED, "charged")
                }
            }),
        )
        .route_layer(layer.clone());
    let server = serve(app).await;
    let key = [("idempotency-key", "\"k-1\"")];
    for _ in 0..2 {
        let reply = server.send_body("POST", "/charges", &key, "a").await;
        assert_eq!(reply.status, StatusCode::CREATED);
        assert_eq!(reply.header("idempotent-replayed"), None);
    }
    // The same key with another body would have been a 422; it runs too.
    let reply = server.send_body("POST", "/charges", &key, "b").await;
    assert_eq!(reply.status, StatusCode::CREATED);
    // No key: would have been a 400.
    assert_eq!(
        server.post("/charges", &[]).await.status,
        StatusCode::CREATED
    );
    assert_eq!(runs.load(Ordering::SeqCst), 4);
    let snap = layer.metrics().snapshot();
    assert_eq!(snap.replayed, 1);
    assert_eq!(snap.rejected.fingerprint_mismatch, 1);
    assert_eq!(snap.rejected.missing_key, 1);
}

#[tokio::test]
async fn a_dry_run_logs_what_it_would_have_done() {
    use tower_lock_core::Outcome;
    use tracing::Level;
    use tracing_subscriber::prelude::*;

    use super::log_capture::Capture;

    let capture = Capture::default();
    let _subscriber =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(capture.clone()));
    let locker = LockLayer::builder(LockEngine::in_memory())
        .key(HeaderKey::new("x-tenant-id"))
        .metrics_name("jobs")
        .dry_run(true)
        .build_locker()
        .unwrap();
    let req = http::Request::post("/jobs")
        .header("x-tenant-id", "acme")
        .body(())
        .unwrap();
    let held = locker.acquire(&req).await;
    assert!(matches!(held, Outcome::Locked(_)), "{held:?}");
    let second = locker.acquire(&req).await;
    // It runs unlocked, with a lease info that holds nothing, for the handler's extractors.
    match &second {
        Outcome::Observed(info) => {
            assert!(info.is_dry_run() && !info.is_lost());
            assert_eq!(info.fence().get(), 0);
            assert!(info.key().as_str().starts_with("%!dry-run/"), "{info:?}");
        }
        other => panic!("{other:?}"),
    }
    let events = capture.take();
    let logged: Vec<_> = events
        .iter()
        .filter(|e| e.level == Level::INFO && e.message().contains("dry run: would have"))
        .collect();
    assert_eq!(logged.len(), 1, "{events:#?}");
    assert_eq!(logged[0].fields["layer"], "jobs");
    assert_eq!(logged[0].fields["reason"], "locked");
    assert_eq!(logged[0].fields["status"], "423");
}
