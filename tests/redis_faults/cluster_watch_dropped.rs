//! A dropped Redis Cluster backend leaves nothing behind: the watch's connection to every
//! node (named `tower-lock-watch`) closes, and its task ends. A backend made and dropped
//! per tenant, or a node leaving the topology, must not cost one connection per node for
//! the life of the process.

use std::time::Duration;

use tower_lock::engine::redis::RedisBackend;
use tower_lock_test_support::redis::{RedisCluster, RedisServer};
use tower_lock_test_support::serial;

/// How many of `node`'s clients carry the watch's name (`CLIENT LIST`).
fn watch_connections(node: &RedisServer) -> usize {
    node.try_cli(["CLIENT", "LIST"])
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("name=tower-lock-watch"))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dropped_cluster_backend_closes_its_watch_connection_to_every_node() {
    let _group = serial::group(module_path!()).await;
    let cluster = tokio::task::spawn_blocking(RedisCluster::start)
        .await
        .unwrap();
    let backend = RedisBackend::cluster(cluster.urls())
        .prefix("cdrop")
        .command_timeout(Duration::from_secs(1))
        .build()
        .await
        .unwrap();
    // Redis 7.0 leaves a replica out of `CLUSTER SLOTS` until it has replicated a write,
    // so on this fresh cluster the primaries are the nodes surely watched.
    tokio::task::block_in_place(|| {
        for node in cluster.primaries() {
            assert_eq!(
                watch_connections(node),
                1,
                "the watch connects to primary {} at build()",
                node.port()
            );
        }
    });
    drop(backend);
    // No event tells a client that a server closed another client's connection: polled.
    tokio::task::block_in_place(|| {
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        loop {
            let left: Vec<(u16, usize)> = cluster
                .nodes()
                .iter()
                .map(|n| (n.port(), watch_connections(n)))
                .filter(|(_, n)| *n > 0)
                .collect();
            if left.is_empty() {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "2 s after the backend was dropped, watch connections are still open (port, count): {left:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    });
}
