//! The conformance suite on the Redis backend, against a redis-server of our own.
//!
//! Cases share one server per test binary and keep apart by key prefix. The clock is real,
//! so the time unit is short but comfortably above a loopback round trip.
#![cfg(feature = "redis")]

use std::time::Duration;

use tower_lock_test_support::{
    conformance::redis,
    conformance_tests, prefix,
    redis::{RedisServer, engine},
};

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
    let prefix = prefix::unique("fifo-across-nodes");
    let node = || engine(server, &prefix, None);
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
