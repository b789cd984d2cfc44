//! The conformance suite's core cases on Postgres, directly connected.

use tower_lock_test_support::{core_conformance_tests, postgres::PostgresServer};

use crate::harness::harness;

/// The shared cluster's URL, started on first use (off the async threads: `initdb` takes a
/// moment).
async fn url() -> String {
    tokio::task::spawn_blocking(|| PostgresServer::shared().url())
        .await
        .unwrap()
}

core_conformance_tests!(
    timed = #[tokio::test(flavor = "multi_thread", worker_threads = 2)],
    concurrent = #[tokio::test(flavor = "multi_thread", worker_threads = 4)],
    harness = async { harness(url().await, None).await },
);
