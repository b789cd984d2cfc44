//! On one redis-server: the test binary's shared one, keys under a prefix of their own.

use tower_lock_test_support::{
    prefix,
    redis::{RedisServer, engine},
};

use crate::scenarios::{self, labelled};

fn store(prefix: &str) -> Vec<String> {
    vec![
        "--redis".to_owned(),
        RedisServer::shared().url(),
        "--prefix".to_owned(),
        prefix.to_owned(),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_key_is_shown_listed_and_released_to_its_waiter() {
    let prefix = prefix::unique("cli");
    let server = RedisServer::shared();
    let a = labelled(engine(server, &prefix, None).await, "node-a:1");
    let b = labelled(engine(server, &prefix, None).await, "node-b:2");
    scenarios::a_held_key_is_shown_listed_and_released_to_its_waiter(
        &store(&prefix),
        a,
        b,
        "billing/header=x-tenant-id/acme",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_is_read_and_deleted_by_key() {
    let prefix = prefix::unique("cli");
    let a = engine(RedisServer::shared(), &prefix, None).await;
    scenarios::a_record_is_read_and_deleted_by_key(&store(&prefix), a, "/idempotency-key/k1").await;
}
