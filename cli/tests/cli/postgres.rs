//! On Postgres (the test binary's shared throwaway cluster), each test in a schema of its
//! own.

use std::sync::atomic::{AtomicU32, Ordering};

use tower_lock_engine::{LockEngine, postgres::PostgresBackend};
use tower_lock_test_support::postgres::PostgresServer;

use crate::scenarios::{self, labelled};

fn schema() -> String {
    static MADE: AtomicU32 = AtomicU32::new(0);
    format!("cli_{}", MADE.fetch_add(1, Ordering::Relaxed))
}

/// A node: its own pool and listener, on `schema` (migrated by the first).
async fn node(schema: &str) -> LockEngine {
    let builder = PostgresBackend::builder(PostgresServer::shared().url())
        .schema(schema)
        .pool_size(2);
    builder.migrate().await.expect("migrate the test schema");
    LockEngine::new(builder.build().await.expect("connect to the test cluster"))
}

fn store(schema: &str) -> Vec<String> {
    vec![
        "--postgres".to_owned(),
        PostgresServer::shared().url(),
        "--schema".to_owned(),
        schema.to_owned(),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_key_is_shown_listed_and_released_to_its_waiter() {
    let schema = schema();
    let a = labelled(node(&schema).await, "node-a:1");
    let b = labelled(node(&schema).await, "node-b:2");
    scenarios::a_held_key_is_shown_listed_and_released_to_its_waiter(
        &store(&schema),
        a,
        b,
        "billing/header=x-tenant-id/acme",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_is_read_and_deleted_by_key() {
    let schema = schema();
    scenarios::a_record_is_read_and_deleted_by_key(&store(&schema), node(&schema).await, "k3")
        .await;
}
