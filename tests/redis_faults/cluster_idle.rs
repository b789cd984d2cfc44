//! On a Redis Cluster, the server's idle `timeout` is not a reset: the watch connection
//! must not be closed by it (or must tell such a close from a node that lost its data),
//! or every live lease would be reported lost every `timeout` seconds while the cluster
//! still holds it.

use std::time::Duration;

use tokio::time::timeout;
use tower_lock::{LockEngine, engine::redis::RedisBackend};
use tower_lock_test_support::redis::RedisCluster;
use tower_lock_test_support::serial;

async fn node(cluster: &RedisCluster) -> LockEngine {
    LockEngine::new(
        RedisBackend::cluster(cluster.urls())
            .prefix("cidle")
            .command_timeout(Duration::from_secs(1))
            .build()
            .await
            .unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cluster_nodes_idle_timeout_does_not_report_leases_lost() {
    let _group = serial::group(module_path!()).await;
    let cluster = tokio::task::spawn_blocking(RedisCluster::start)
        .await
        .unwrap();
    for node in cluster.nodes() {
        node.cli(["CONFIG", "SET", "timeout", "1"]);
    }
    let engine = node(&cluster).await;
    let leases = [
        engine
            .lock("a")
            .ttl(Duration::from_secs(30))
            .acquire()
            .await
            .unwrap(),
        engine
            .lock("b")
            .ttl(Duration::from_secs(30))
            .acquire()
            .await
            .unwrap(),
        engine
            .lock("c")
            .ttl(Duration::from_secs(30))
            .acquire()
            .await
            .unwrap(),
    ];
    // Three idle timeouts and more: the nodes close every connection idle for a second.
    let any_lost = futures_util::future::select_all(leases.iter().map(|l| Box::pin(l.lost())));
    if let Ok((_, which, _)) = timeout(Duration::from_millis(3500), any_lost).await {
        panic!(
            "lease {which} was reported lost by the nodes' idle timeout (the cluster still holds it)"
        );
    }
    for lease in leases {
        assert!(lease.owned().await.unwrap(), "the cluster still holds it");
        lease.release().await.unwrap();
    }
}
