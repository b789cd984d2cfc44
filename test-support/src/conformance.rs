//! The conformance suite of `tower-lock-engine` (its `conformance` feature), re-exported
//! with the harnesses that need this repository: the core-only backend (a fixture of this
//! crate) and the Redis backends on the test servers.

use std::time::Duration;

pub use tower_lock_engine::conformance::*;

use crate::scripted::Scripted;

/// `n` entries, named by number.
fn entries(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("entry {i}")).collect()
}

/// A fresh in-process backend that reports no optional capability: what a backend
/// implementing the core `Backend` trait only has to pass.
pub async fn core_only() -> BackendHarness<Scripted> {
    BackendHarness::new(Scripted::core_only(), Duration::from_millis(100), |b| {
        Box::pin(async move { entries(b.inner.key_count()) })
    })
}

/// A fresh Redis backend on the binary's shared redis-server, under a prefix of its own.
/// The time unit is short but comfortably above a loopback round trip.
#[cfg(feature = "redis")]
pub async fn redis() -> BackendHarness<tower_lock_engine::redis::RedisBackend> {
    use tower_lock_engine::redis::RedisBackend;

    use crate::redis::{RedisServer, is_fence_tombstone};

    let prefix = crate::prefix::unique("conformance");
    let backend = RedisBackend::builder(RedisServer::shared().url())
        .prefix(&prefix)
        .build()
        .await
        .expect("connect to the test redis-server");
    BackendHarness::new(backend, Duration::from_millis(150), |b| {
        let pattern = format!("{}:*", b.prefix());
        Box::pin(async move {
            let keys = tokio::task::spawn_blocking(move || RedisServer::shared().scan(&pattern))
                .await
                .unwrap();
            // Fence tombstones are documented: short-lived (TTL), kept so fences never
            // repeat.
            keys.into_iter()
                .filter(|k| !is_fence_tombstone(k))
                .collect()
        })
    })
}

/// A fresh Redis Cluster backend on the binary's shared test cluster, under a prefix of
/// its own. Lock pools are not offered on a cluster (see the backend's docs).
#[cfg(feature = "redis-cluster")]
pub async fn redis_cluster() -> BackendHarness<tower_lock_engine::redis::RedisBackend> {
    use tower_lock_engine::redis::RedisBackend;

    use crate::redis::{RedisCluster, is_fence_tombstone};

    let prefix = crate::prefix::unique("cluster");
    let cluster = tokio::task::spawn_blocking(RedisCluster::shared)
        .await
        .unwrap();
    let backend = RedisBackend::cluster(cluster.urls())
        .prefix(&prefix)
        .build()
        .await
        .expect("connect to the test cluster");
    BackendHarness::new(backend, Duration::from_millis(150), |b| {
        let pattern = format!("{}:*", b.prefix());
        Box::pin(async move {
            let keys = tokio::task::spawn_blocking(move || RedisCluster::shared().scan(&pattern))
                .await
                .unwrap();
            keys.into_iter()
                .filter(|k| !is_fence_tombstone(k))
                .collect()
        })
    })
}
