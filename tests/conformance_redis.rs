//! The conformance suite on the Redis backend, against a redis-server of our own.
//!
//! Cases share one server per test binary and keep apart by key prefix. The clock is real,
//! so the time unit is short but comfortably above a loopback round trip.
#![cfg(feature = "redis")]

mod support;

use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    sync::atomic::{AtomicUsize, Ordering},
    time::Duration,
};

use support::{conformance::Harness, redis::RedisServer};
use tower_lock::{
    LockEngine,
    engine::{Backend, redis::RedisBackend},
};

struct Redis {
    backend: Arc<RedisBackend>,
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
    let backend = Arc::new(backend);
    Redis {
        engine: LockEngine::from_arc(backend.clone()),
        backend,
        prefix,
    }
}

impl Harness for Redis {
    fn engine(&self) -> LockEngine {
        self.engine.clone()
    }

    fn backend(&self) -> Arc<dyn Backend> {
        self.backend.clone()
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

/// Beyond the shared suite: FIFO order holds across nodes, each with its own pool and
/// subscriber connection, sharing one Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifo_order_holds_across_nodes() {
    use std::sync::{Arc, Mutex};

    let server = RedisServer::shared();
    let node = || async {
        let backend = RedisBackend::builder(server.url())
            .prefix("fifo-across-nodes")
            .build()
            .await
            .unwrap();
        LockEngine::new(backend)
    };
    let nodes = [node().await, node().await, node().await];
    let holder = nodes[0].lock("k").fifo(true).acquire().await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..9 {
        let (engine, order) = (nodes[i % 3].clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let lease = engine.lock("k").fifo(true).acquire().await.unwrap();
            order.lock().unwrap().push(i);
            lease.release().await.unwrap();
        }));
        // Arrival order is defined once the waiter is queued.
        let give_up = tokio::time::Instant::now() + Duration::from_secs(10);
        while nodes[0].lock("k").waiters().await.unwrap() != i + 1 {
            assert!(
                tokio::time::Instant::now() < give_up,
                "waiter {i} never queued"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    holder.release().await.unwrap();
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(*order.lock().unwrap(), (0..9).collect::<Vec<_>>());
}
