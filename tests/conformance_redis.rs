//! The conformance suite on the Redis backend, against a redis-server of our own.
//!
//! Cases share one server per test binary and keep apart by key prefix. The clock is real,
//! so the time unit is short but comfortably above a loopback round trip.
#![cfg(feature = "redis")]

mod support;

use std::{
    future::Future,
    pin::Pin,
    sync::atomic::{AtomicUsize, Ordering},
    time::Duration,
};

use support::{conformance::Harness, redis::RedisServer};
use tower_lock::{LockEngine, engine::redis::RedisBackend};

struct Redis {
    engine: LockEngine,
    prefix: String,
}

async fn redis() -> Redis {
    static CASES: AtomicUsize = AtomicUsize::new(0);
    let server = RedisServer::shared();
    let prefix = format!("conformance-{}", CASES.fetch_add(1, Ordering::Relaxed));
    let backend = RedisBackend::builder(server.url())
        .prefix(&prefix)
        .build()
        .await
        .expect("connect to the test redis-server");
    Redis {
        engine: LockEngine::new(backend),
        prefix,
    }
}

impl Harness for Redis {
    fn engine(&self) -> LockEngine {
        self.engine.clone()
    }

    fn unit(&self) -> Duration {
        Duration::from_millis(150)
    }

    fn residue(&self) -> Pin<Box<dyn Future<Output = Vec<String>> + Send + '_>> {
        let pattern = format!("{}:*", self.prefix);
        Box::pin(async move {
            let keys = tokio::task::spawn_blocking(move || RedisServer::shared().scan(&pattern))
                .await
                .unwrap();
            // Fence tombstones are documented: short-lived (TTL), kept so fences never repeat.
            keys.into_iter()
                .filter(|k| {
                    !k.split_once("}:")
                        .is_some_and(|(_, rest)| rest.starts_with("fence:"))
                })
                .collect()
        })
    }
}

conformance_tests!(
    timed = #[tokio::test(flavor = "multi_thread", worker_threads = 2)],
    concurrent = #[tokio::test(flavor = "multi_thread", worker_threads = 4)],
    harness = redis(),
);
