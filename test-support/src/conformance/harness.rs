//! The harnesses of the backends in this repository: in-process, core-only (the
//! in-process backend seen through the core trait only) and Redis.

use std::{future::Future, pin::Pin, sync::Arc, time::Duration};

use tower_lock::{LockEngine, MemoryBackend, engine::Backend};

use super::Harness;
use crate::scripted::Scripted;

/// What a backend still keeps: a list of keys or entries.
type Residue<B> = fn(&B) -> Pin<Box<dyn Future<Output = Vec<String>> + Send + '_>>;

/// A backend under test, the engine on it, the time unit of its TTL cases, and how to list
/// what it still keeps.
pub struct BackendHarness<B> {
    backend: Arc<B>,
    engine: LockEngine,
    unit: Duration,
    residue: Residue<B>,
}

impl<B: Backend> BackendHarness<B> {
    fn new(backend: B, unit: Duration, residue: Residue<B>) -> Self {
        let backend = Arc::new(backend);
        let engine = LockEngine::from_arc(backend.clone());
        BackendHarness {
            backend,
            engine,
            unit,
            residue,
        }
    }

    /// The backend under test.
    pub fn backend_ref(&self) -> &B {
        &self.backend
    }
}

impl<B: Backend> Harness for BackendHarness<B> {
    fn engine(&self) -> LockEngine {
        self.engine.clone()
    }

    fn backend(&self) -> Arc<dyn Backend> {
        self.backend.clone()
    }

    fn unit(&self) -> Duration {
        self.unit
    }

    fn residue(&self) -> Pin<Box<dyn Future<Output = Vec<String>> + Send + '_>> {
        (self.residue)(&self.backend)
    }
}

/// `n` entries, named by number.
fn entries(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("entry {i}")).collect()
}

/// A fresh in-process backend, on the real clock (the engine keeps time for leases on its
/// own thread, which a paused test clock does not drive).
pub async fn memory() -> BackendHarness<MemoryBackend> {
    BackendHarness::new(MemoryBackend::new(), Duration::from_millis(100), |b| {
        Box::pin(async move { entries(b.key_count()) })
    })
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
pub async fn redis() -> BackendHarness<tower_lock::engine::redis::RedisBackend> {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tower_lock::engine::redis::RedisBackend;

    use crate::redis::{RedisServer, is_fence_tombstone};

    static CASES: AtomicUsize = AtomicUsize::new(0);
    let prefix = format!("conformance-{}", CASES.fetch_add(1, Ordering::Relaxed));
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
pub async fn redis_cluster() -> BackendHarness<tower_lock::engine::redis::RedisBackend> {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tower_lock::engine::redis::RedisBackend;

    use crate::redis::{RedisCluster, is_fence_tombstone};

    static CASES: AtomicUsize = AtomicUsize::new(0);
    let prefix = format!("cluster-{}", CASES.fetch_add(1, Ordering::Relaxed));
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
