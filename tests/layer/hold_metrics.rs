//! What a layer tells of its holds: the holding gauge follows the leases (a lease taken
//! away from a request that still runs leaves it at once), the oldest-hold gauge, and the
//! hold log lines. Through a real server socket (axum on 127.0.0.1:0), on the in-process
//! engine, on Redis and (feature `postgres`) on Postgres.

use std::{sync::Arc, time::Duration};

use axum::{Extension, Router, routing::post};
use tokio::sync::mpsc;
use tower_lock::{LeaseInfo, LockLayer};
use tower_lock_test_support::{
    http::{TestServer, serve},
    scenarios::{Backend, FOR_K, LockTable},
};

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
