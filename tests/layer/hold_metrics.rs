//! What a layer tells of its holds: the holding gauge follows the leases (a lease taken
//! away from a request that still runs leaves it at once), the oldest-hold gauge, and the
//! hold log lines. Through a real server socket (axum on 127.0.0.1:0), on the in-process
//! engine, on Redis and (feature `postgres`) on Postgres.

use std::{sync::Arc, time::Duration};

use axum::{Extension, Router, routing::post};
use tokio::sync::{mpsc, oneshot};
use tower_lock::{LeaseInfo, LockEngine, LockLayer};
use tower_lock_test_support::{
    http::{TestServer, serve},
    scenarios::{Backend, FOR_K, LockTable, header_key},
};
use tracing::{Instrument, Level};
use tracing_subscriber::layer::SubscriberExt;

use super::log_capture::{Capture, Captured};

/// A server whose `POST /work` hands the test its lease and never answers (a hung
/// handler), under `layer`; the test's side receives each request's lease once it is
/// inside.
async fn hung_handler(layer: &LockLayer) -> (Arc<TestServer>, mpsc::UnboundedReceiver<LeaseInfo>) {
    let (inside, leases) = mpsc::unbounded_channel();
    let app = Router::new()
        .route(
            "/work",
            post(move |Extension(info): Extension<LeaseInfo>| {
                let inside = inside.clone();
                async move {
                    inside.send(info).unwrap();
                    std::future::pending::<&'static str>().await
                }
            }),
        )
        .route_layer(layer.clone());
    (Arc::new(serve(app).await), leases)
}

/// Send `POST /work` for key `k` and wait until its handler holds the key.
async fn holds_k(
    server: &Arc<TestServer>,
    leases: &mut mpsc::UnboundedReceiver<LeaseInfo>,
) -> (tokio::task::JoinHandle<()>, LeaseInfo) {
    let server = server.clone();
    let request = tokio::spawn(async move {
        server.post("/work", FOR_K).await;
    });
    let info = tokio::time::timeout(Duration::from_secs(10), leases.recv())
        .await
        .expect("the request reaches its handler within 10 s")
        .unwrap();
    (request, info)
}

/// The case: an operator force-releases a key whose handler hangs. Once the
/// holder's lease is lost, its request holds nothing: the holding gauge must not count it
/// (it stayed at 1 until the hung request ended), and the lost lease is counted then, not
/// at the request's end.
async fn force_released_holder_leaves_the_holding_gauge(table: LockTable, name: &str) {
    #[cfg(feature = "metrics")]
    exported::install();
    // A short TTL: the holder's first renewal (at a third of it) finds the key gone.
    let layer = table
        .layer()
        .ttl(Duration::from_secs(1))
        .metrics_name(name)
        .build()
        .unwrap();
    let (server, mut leases) = hung_handler(&layer).await;
    let (request, info) = holds_k(&server, &mut leases).await;
    assert_eq!(layer.metrics().snapshot().holding, 1);
    let admin = table.engine().admin();
    assert!(admin.force_release(info.key().as_str()).await.unwrap());
    tokio::time::timeout(Duration::from_secs(10), info.lost_signal().lost())
        .await
        .expect("the holder learns within 10 s that its lease is gone");
    let snap = layer.metrics().snapshot();
    assert_eq!(
        (snap.holding, snap.lost),
        (0, 1),
        "a request whose lease was taken away holds nothing, though its handler still runs"
    );
    #[cfg(feature = "metrics")]
    exported::until(name, "tower_lock_requests_holding", 0.0).await;
    request.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_released_holder_leaves_the_holding_gauge_in_process() {
    let table = Backend::InProcess.table("holding-gauge").await;
    force_released_holder_leaves_the_holding_gauge(table, "holding-gauge-memory").await;
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_released_holder_leaves_the_holding_gauge_on_redis() {
    let table = Backend::Redis.table("holding-gauge").await;
    force_released_holder_leaves_the_holding_gauge(table, "holding-gauge-redis").await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_released_holder_leaves_the_holding_gauge_on_postgres() {
    let table = Backend::Postgres.table("holding-gauge").await;
    force_released_holder_leaves_the_holding_gauge(table, "holding-gauge-postgres").await;
}

/// The series exported through the `metrics` facade, read back from a Prometheus recorder
/// installed once for this test binary (no other test of the binary installs one).
#[cfg(feature = "metrics")]
mod exported {
    use std::{sync::OnceLock, time::Duration};

    use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

    fn handle() -> &'static PrometheusHandle {
        static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
        HANDLE.get_or_init(|| {
            PrometheusBuilder::new()
                .install_recorder()
                .expect("the first recorder of this test binary")
        })
    }

    /// Install the recorder before a layer's first event (gauges move by events).
    pub(super) fn install() {
        handle();
    }

    /// The value of `name{layer="<layer>"}` now, if exported.
    pub(super) fn value(layer: &str, name: &str) -> Option<f64> {
        let head = format!("{name}{{layer=\"{layer}\"}} ");
        handle()
            .render()
            .lines()
            .find_map(|line| line.strip_prefix(&head)?.parse().ok())
    }

    /// Wait until `name{layer="<layer>"}` is `want`: the layer's watch task sets it at its
    /// next look (every second), an event the test cannot await from outside.
    pub(super) async fn until(layer: &str, name: &str, want: f64) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            let got = value(layer, name);
            if got == Some(want) {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{name}{{layer={layer:?}}} is {got:?}, not {want}, 5 s on"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// A server whose `POST /work` runs each request in a span `request` (as a tracing
/// middleware would), hands the test its lease, and answers once the test says so.
async fn traced_handler(
    layer: &LockLayer,
) -> (
    Arc<TestServer>,
    mpsc::UnboundedReceiver<(LeaseInfo, oneshot::Sender<()>)>,
) {
    let (inside, leases) = mpsc::unbounded_channel();
    let app = Router::new()
        .route(
            "/work",
            post(move |Extension(info): Extension<LeaseInfo>| {
                let inside = inside.clone();
                async move {
                    let (done, answer) = oneshot::channel();
                    inside.send((info, done)).unwrap();
                    answer.await.unwrap();
                    "done"
                }
            }),
        )
        .route_layer(layer.clone())
        .layer(axum::middleware::from_fn(
            |req: axum::extract::Request, next: axum::middleware::Next| {
                next.run(req).instrument(tracing::info_span!("request"))
            },
        ));
    (Arc::new(serve(app).await), leases)
}

/// The first captured event with `message`, waited for up to 5 s: the watch task logs a
/// long hold at its next look, an event the test cannot await from outside.
async fn logged(capture: &Capture, message: &str) -> Captured {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(event) = capture
            .events()
            .into_iter()
            .find(|e| e.message() == message)
        {
            return event;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no {message:?} logged within 5 s: {:#?}",
            capture.events()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The line names the hold's key, fence and holder label, within the request's span.
fn names_the_hold(event: &Captured, info: &LeaseInfo) {
    assert_eq!(event.fields["key"], info.key().as_str(), "{event:?}");
    assert_eq!(event.fields["fence"], info.fence().to_string(), "{event:?}");
    assert!(event.fields.contains_key("holder"), "{event:?}");
    assert!(
        event.spans.iter().any(|s| s == "request"),
        "logged outside the request's span: {event:?}"
    );
}

/// Every grant and release is logged at `debug` with key, fence and holder within the
/// request's span; a hold past `log_holds_longer_than` is logged at `info` while it is
/// still held (by the layer's watch task, within the request's span all the same) and at
/// its release; the oldest-hold gauge tells how long it has lasted.
#[tokio::test]
async fn holds_are_logged_with_key_fence_and_holder_and_long_ones_at_info() {
    #[cfg(feature = "metrics")]
    exported::install();
    let capture = Capture::default();
    let _subscriber =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(capture.clone()));
    let name = "hold-log";
    let long = Duration::from_millis(300);
    let layer = LockLayer::builder(LockEngine::in_memory())
        .key(header_key())
        .metrics_name(name)
        .log_holds_longer_than(long)
        .build()
        .unwrap();
    let (server, mut leases) = traced_handler(&layer).await;

    // A short hold: `debug` lines only.
    let request = {
        let server = server.clone();
        tokio::spawn(async move { server.post("/work", FOR_K).await })
    };
    let (info, done) = leases.recv().await.unwrap();
    names_the_hold(&logged(&capture, "lock acquired").await, &info);
    done.send(()).unwrap();
    assert_eq!(request.await.unwrap().text(), "done");
    let released = logged(&capture, "lock released").await;
    names_the_hold(&released, &info);
    assert_eq!(released.level, Level::DEBUG);
    assert!(!capture.events().iter().any(|e| e.level == Level::INFO));
    assert_eq!(layer.metrics().snapshot().oldest_hold, None);

    // A long one: `info` while held, and at its release.
    capture.take();
    let request = {
        let server = server.clone();
        tokio::spawn(async move { server.post("/work", FOR_K).await })
    };
    let (info, done) = leases.recv().await.unwrap();
    let still = logged(&capture, "lock held longer than the threshold").await;
    assert_eq!(still.level, Level::INFO);
    names_the_hold(&still, &info);
    let oldest = layer.metrics().snapshot().oldest_hold.unwrap();
    assert!(oldest >= long, "{oldest:?}");
    #[cfg(feature = "metrics")]
    {
        // Set by the watch task at each look: at least the threshold once it logged.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while exported::value(name, "tower_lock_oldest_hold_seconds") < Some(long.as_secs_f64()) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "oldest-hold gauge not set"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    done.send(()).unwrap();
    assert_eq!(request.await.unwrap().text(), "done");
    let released = logged(&capture, "long hold released").await;
    assert_eq!(released.level, Level::INFO);
    names_the_hold(&released, &info);
    assert_eq!(layer.metrics().snapshot().oldest_hold, None);
    #[cfg(feature = "metrics")]
    exported::until(name, "tower_lock_oldest_hold_seconds", 0.0).await;
}
