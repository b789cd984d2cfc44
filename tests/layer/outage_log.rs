//! A backend outage is logged at its transitions and summarized while it lasts, not once
//! per request: the events are captured by a tracing subscriber while a scripted backend
//! fails its acquisitions and then answers again.

use std::{
    fmt,
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use tower_lock::{BackendFailurePolicy, LockEngine, LockLayer, RejectionKind, key::HeaderKey};
use tower_lock_core::{Outcome, RequestLocker};
use tower_lock_test_support::scripted::Scripted;
use tracing::Level;
use tracing_subscriber::prelude::*;

use super::log_capture::{Capture, Captured};

async fn send(locker: &RequestLocker) -> Outcome {
    let req = http::Request::post("/jobs")
        .header("x-tenant-id", "acme")
        .body(())
        .unwrap();
    locker.acquire(&req).await
}

/// Events at `info` or above: what an operator's log shows.
fn visible(events: &[Captured]) -> Vec<&Captured> {
    events.iter().filter(|e| e.level <= Level::INFO).collect()
}

#[tokio::test(start_paused = true)]
async fn an_outage_is_logged_once_down_summarized_while_it_lasts_and_once_back_up() {
    let capture = Capture::default();
    let _subscriber =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(capture.clone()));
    let backend = Arc::new(Scripted::default());
    let locker = LockLayer::builder(LockEngine::from_arc(backend.clone()))
        .key(HeaderKey::new("x-tenant-id"))
        .metrics_name("jobs")
        .build_locker()
        .unwrap();

    backend.fail_acquires.store(true, Ordering::SeqCst);
    for _ in 0..5 {
        match send(&locker).await {
            Outcome::Rejected(r) => assert_eq!(r.kind(), RejectionKind::BackendUnavailable),
            other => panic!("expected a 503, got {other:?}"),
        }
    }
    let events = capture.take();
    let shown = visible(&events);
    assert_eq!(shown.len(), 1, "one event for the transition: {shown:#?}");
    assert_eq!(shown[0].level, Level::ERROR);
    assert!(shown[0].message().contains("unavailable"), "{shown:#?}");
    assert_eq!(shown[0].fields["layer"], "jobs");
    assert!(
        shown[0].fields["error"].contains("partitioned"),
        "{shown:#?}"
    );
    // Each of the other four requests is detailed at debug.
    let detail = events
        .iter()
        .filter(|e| e.level == Level::DEBUG && e.message().contains("still unavailable"))
        .count();
    assert_eq!(detail, 4, "{events:#?}");

    // While it lasts: one summary per period, counting the requests since the last one.
    tokio::time::advance(Duration::from_secs(10)).await;
    for _ in 0..3 {
        assert!(matches!(send(&locker).await, Outcome::Rejected(_)));
    }
    let events = capture.take();
    let shown = visible(&events);
    assert_eq!(shown.len(), 1, "one summary: {shown:#?}");
    assert_eq!(shown[0].level, Level::WARN);
    assert_eq!(shown[0].fields["affected"], "5");
    assert_eq!(shown[0].fields["affected_total"], "6");

    // Back up: one event with the outage's total, then silence.
    backend.fail_acquires.store(false, Ordering::SeqCst);
    assert!(matches!(send(&locker).await, Outcome::Locked(_)));
    assert!(matches!(send(&locker).await, Outcome::Locked(_)));
    let events = capture.take();
    let shown = visible(&events);
    assert_eq!(shown.len(), 1, "one event for the recovery: {shown:#?}");
    assert_eq!(shown[0].level, Level::INFO);
    assert!(shown[0].message().contains("available again"), "{shown:#?}");
    assert_eq!(shown[0].fields["affected_total"], "8");

    // A second outage is a new transition.
    backend.fail_acquires.store(true, Ordering::SeqCst);
    assert!(matches!(send(&locker).await, Outcome::Rejected(_)));
    let events = capture.take();
    assert_eq!(visible(&events).len(), 1);
    assert_eq!(visible(&events)[0].level, Level::ERROR);
}

/// An outage's end is seen only at the next request; the recovery's `down_for` stops at
/// the last failed request, and the quiet stretch after it is reported apart
/// (`seen_after`), never counted as downtime.
#[tokio::test(start_paused = true)]
async fn a_recovery_seen_long_after_the_last_failure_does_not_overstate_the_outage() {
    let capture = Capture::default();
    let _subscriber =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(capture.clone()));
    let backend = Arc::new(Scripted::default());
    let locker = LockLayer::builder(LockEngine::from_arc(backend.clone()))
        .key(HeaderKey::new("x-tenant-id"))
        .metrics_name("jobs")
        .build_locker()
        .unwrap();
    backend.fail_acquires.store(true, Ordering::SeqCst);
    assert!(matches!(send(&locker).await, Outcome::Rejected(_)));
    tokio::time::advance(Duration::from_secs(2)).await;
    assert!(matches!(send(&locker).await, Outcome::Rejected(_)));
    // The backend comes back, and nobody calls for a while.
    backend.fail_acquires.store(false, Ordering::SeqCst);
    tokio::time::advance(Duration::from_secs(5)).await;
    capture.take();
    assert!(matches!(send(&locker).await, Outcome::Locked(_)));
    let events = capture.take();
    let shown = visible(&events);
    assert_eq!(shown.len(), 1, "{shown:#?}");
    assert_eq!(shown[0].fields["down_for"], "2s", "{shown:#?}");
    assert_eq!(shown[0].fields["seen_after"], "5s", "{shown:#?}");
}

#[tokio::test(start_paused = true)]
async fn a_fail_open_outage_is_logged_at_its_transitions_too() {
    let capture = Capture::default();
    let _subscriber =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(capture.clone()));
    let backend = Arc::new(Scripted::default());
    let locker = LockLayer::builder(LockEngine::from_arc(backend.clone()))
        .key(HeaderKey::new("x-tenant-id"))
        .on_backend_failure(BackendFailurePolicy::FailOpen)
        .build_locker()
        .unwrap();
    backend.fail_acquires.store(true, Ordering::SeqCst);
    for _ in 0..4 {
        assert!(matches!(send(&locker).await, Outcome::Unlocked));
    }
    let events = capture.take();
    let shown = visible(&events);
    assert_eq!(shown.len(), 1, "{shown:#?}");
    assert!(shown[0].message().contains("fail open"), "{shown:#?}");
    // Without a metrics name, the layer is named by its extractor's kind.
    assert_eq!(shown[0].fields["layer"], "header=x-tenant-id");
}

/// Idempotency replay reads its record before it locks: an outage seen there is logged
/// the same way, once down and once back up.
#[cfg(feature = "redis")]
#[tokio::test]
async fn a_replay_layer_logs_an_outage_at_its_transitions_too() {
    use std::convert::Infallible;

    use http::StatusCode;
    use tower::{ServiceBuilder, ServiceExt, service_fn};
    use tower_lock::IdempotencyLayer;
    use tower_lock_test_support::redis::{RedisServer, engine};

    let capture = Capture::default();
    let _subscriber =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(capture.clone()));
    let server = RedisServer::start();
    let engine = engine(&server, "outage", Some(Duration::from_millis(200))).await;
    let layer = IdempotencyLayer::builder(engine)
        .unscoped()
        .metrics_name("orders")
        .build()
        .unwrap();
    let service = ServiceBuilder::new().layer(layer).service(service_fn(
        |_req: http::Request<tower_lock::idempotency::RequestBody<String>>| async {
            Ok::<_, Infallible>(http::Response::new(String::from("ok")))
        },
    ));
    let send = || {
        let req = http::Request::post("/orders")
            .header("idempotency-key", "\"o1\"")
            .body(String::new())
            .unwrap();
        service.clone().oneshot(req)
    };
    server.kill();
    for _ in 0..5 {
        let res = send().await.unwrap();
        assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    }
    let events = capture.take();
    let shown = visible(&events);
    assert_eq!(shown.len(), 1, "one event for the transition: {shown:#?}");
    assert_eq!(shown[0].level, Level::ERROR);
    assert_eq!(shown[0].fields["layer"], "orders");

    server.restart();
    let give_up = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        // The first request after the outage runs under its key (its response, dropped
        // here, is drained and stored, which logs nothing an operator sees).
        if send().await.unwrap().status() == StatusCode::OK {
            break;
        }
        assert!(
            tokio::time::Instant::now() < give_up,
            "the backend never came back"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let events = capture.take();
    let shown = visible(&events);
    assert_eq!(shown.len(), 1, "one event for the recovery: {shown:#?}");
    assert_eq!(shown[0].level, Level::INFO);
    assert!(shown[0].message().contains("available again"), "{shown:#?}");
}

/// A key the server's own setup cannot derive (here: a principal scope with no
/// authentication layer) is a `500`, logged once with the route and the cause, then at most
/// once a minute with how many were not logged: never a `400` per request that blames the
/// client.
#[tokio::test(start_paused = true)]
async fn a_misconfigured_key_is_a_500_logged_once_then_throttled() {
    #[derive(Clone)]
    struct Account(u64);
    impl fmt::Display for Account {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "{}", self.0)
        }
    }
    let capture = Capture::default();
    let _subscriber =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(capture.clone()));
    let locker = LockLayer::builder(LockEngine::in_memory())
        .key(tower_lock::key::ScopedKey::by(
            tower_lock::key::Principal::<Account>::new(),
            HeaderKey::new("x-tenant-id"),
        ))
        .metrics_name("jobs")
        .build_locker()
        .unwrap();
    for _ in 0..5 {
        match send(&locker).await {
            Outcome::Rejected(r) => {
                assert_eq!(r.kind(), RejectionKind::Misconfigured);
                assert_eq!(r.status(), http::StatusCode::INTERNAL_SERVER_ERROR);
            }
            other => panic!("expected a 500, got {other:?}"),
        }
    }
    let events = capture.take();
    let shown = visible(&events);
    assert_eq!(shown.len(), 1, "one error for five requests: {shown:#?}");
    assert_eq!(shown[0].level, Level::ERROR);
    assert_eq!(shown[0].fields["layer"], "jobs");
    assert_eq!(shown[0].fields["route"], "/jobs");
    assert!(shown[0].fields["cause"].contains("Account"), "{shown:#?}");
    // A minute later, once more, counting the requests not logged meanwhile.
    tokio::time::advance(Duration::from_secs(61)).await;
    let _ = send(&locker).await;
    let shown: Vec<Captured> = visible(&capture.take()).into_iter().cloned().collect();
    assert_eq!(shown.len(), 1, "{shown:#?}");
    assert_eq!(shown[0].fields["unlogged_since_last"], "4");
}
