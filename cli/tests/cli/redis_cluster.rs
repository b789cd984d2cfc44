//! On a Redis Cluster (the test binary's shared one): `list` scans every primary.

use tower_lock_engine::{LockEngine, redis::RedisBackend};
use tower_lock_test_support::{prefix, redis::RedisCluster};

use crate::scenarios::{self, labelled};

async fn node(prefix: &str) -> LockEngine {
    LockEngine::new(
        RedisBackend::cluster(RedisCluster::shared().urls())
            .prefix(prefix)
            .build()
            .await
            .expect("connect to the test cluster"),
    )
}

fn store(prefix: &str) -> Vec<String> {
    vec![
        "--redis-cluster".to_owned(),
        RedisCluster::shared().urls().join(","),
        "--prefix".to_owned(),
        prefix.to_owned(),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_key_is_shown_listed_and_released_to_its_waiter() {
    let prefix = prefix::unique("cli");
    let a = labelled(node(&prefix).await, "node-a:1");
    let b = labelled(node(&prefix).await, "node-b:2");
    scenarios::a_held_key_is_shown_listed_and_released_to_its_waiter(
        &store(&prefix),
        a,
        b,
        "orders/path//orders/{42}",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_is_read_and_deleted_by_key() {
    let prefix = prefix::unique("cli");
    scenarios::a_record_is_read_and_deleted_by_key(&store(&prefix), node(&prefix).await, "k2")
        .await;
}
