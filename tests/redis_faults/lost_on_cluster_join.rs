//! `lost()` never lags a second holder on a Redis Cluster node that joined after `build()`:
//! a replica added to a shard, promoted by `CLUSTER FAILOVER`, grants a key; then it
//! crashes and comes straight back empty, still the primary of the key's slot (its
//! `nodes.conf` says so, and its old primary, now its replica, resyncs the empty data set).
//! It would hand the key to the first node that asks; so the holder must have been told
//! its lease is lost before that node answers anyone.

use std::{
    process::{Command, Stdio},
    time::Duration,
};

use tokio::time::{Instant, timeout};
use tower_lock::{LockEngine, LockError, engine::redis::RedisBackend};
use tower_lock_test_support::redis::{RedisCluster, RedisServer};
use tower_lock_test_support::serial;

async fn node(cluster: &RedisCluster) -> LockEngine {
    LockEngine::new(
        RedisBackend::cluster(cluster.urls())
            .prefix("cjoin")
            .command_timeout(Duration::from_secs(1))
            .build()
            .await
            .unwrap(),
    )
}

/// The slot of lock `key`'s Redis keys (the engine's hash tag: FNV-1a of the key).
fn slot_of(cluster: &RedisCluster, key: &str) -> u16 {
    let tag = key.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    cluster.slot(&format!("{{{tag:016x}}}"))
}

/// Poll `done` (a server's state: no event tells a client) until it holds, or panic.
fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + limit;
    while !done() {
        assert!(std::time::Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A seventh node, started as the fixture starts its six, joined to the cluster as a
/// replica of `primary`, in sync with it and known as such to every node (the other
/// primaries vote in its failover).
fn join_replica(
    cluster: &RedisCluster,
    primary: &RedisServer,
    dir: &std::path::Path,
) -> RedisServer {
    std::fs::create_dir_all(dir).expect("create the new node's directory");
    let joined = RedisServer::start_with([
        "--cluster-enabled".to_owned(),
        "yes".to_owned(),
        "--dir".to_owned(),
        dir.to_string_lossy().into_owned(),
        "--cluster-node-timeout".to_owned(),
        "1000".to_owned(),
        "--repl-diskless-sync-delay".to_owned(),
        "0".to_owned(),
        "--repl-diskless-load".to_owned(),
        "on-empty-db".to_owned(),
    ]);
    let out = Command::new("redis-cli")
        .args(["--cluster", "add-node"])
        .arg(format!("127.0.0.1:{}", joined.port()))
        .arg(format!("127.0.0.1:{}", primary.port()))
        .args(["--cluster-slave", "--cluster-master-id"])
        .arg(primary.cli(["CLUSTER", "MYID"]))
        .stdin(Stdio::null())
        .output()
        .expect("run redis-cli --cluster add-node");
    assert!(out.status.success(), "add-node failed: {out:?}");
    wait_until(
        "the new replica never synced",
        Duration::from_secs(10),
        || {
            joined
                .try_cli(["INFO", "replication"])
                .is_some_and(|i| i.contains("master_link_status:up"))
        },
    );
    let id = joined.cli(["CLUSTER", "MYID"]);
    wait_until(
        "not every node learnt of the new replica",
        Duration::from_secs(10),
        || {
            cluster.nodes().iter().all(|n| {
                n.cli(["CLUSTER", "NODES"])
                    .lines()
                    .any(|l| l.starts_with(&id) && l.contains("slave"))
            })
        },
    );
    joined
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_that_joined_after_build_reports_the_lease_lost_when_it_comes_back_empty() {
    let _group = serial::group(module_path!()).await;
    let cluster = tokio::task::spawn_blocking(RedisCluster::start)
        .await
        .unwrap();
    // Both built before the new node joins.
    let holder = node(&cluster).await;
    let second = node(&cluster).await;
    let slot = slot_of(&cluster, "k");

    let dir = tower_lock_test_support::scratch::dir("cluster-join");
    let joined = tokio::task::block_in_place(|| {
        let old = cluster.primary_of(slot);
        let joined = join_replica(&cluster, old, &dir);
        assert_eq!(joined.cli(["CLUSTER", "FAILOVER"]), "OK");
        wait_until(
            "the failover to the new node never happened",
            Duration::from_secs(10),
            || joined.cli(["ROLE"]).starts_with("master") && old.cli(["ROLE"]).starts_with("slave"),
        );
        // The watch follows the topology within a second or so of a change (see the
        // Cluster watch); its connection to the new node carries this name. Code that
        // never watches the node goes on after the bound, to fail below.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !joined
            .cli(["CLIENT", "LIST"])
            .contains("name=tower-lock-watch")
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(20));
        }
        joined
    });

    // The default TTL: no renewal falls due before the restart is answered.
    let lease = holder.lock("k").acquire().await.unwrap();
    let signal = lease.lost_signal();
    assert!(
        !joined.scan("cjoin:*lock:k").is_empty(),
        "the new node granted k"
    );

    // SIGKILL, and back at once on the same port, empty, before the cluster fails it over.
    let killed = Instant::now();
    tokio::task::block_in_place(|| joined.restart());
    // The second node asks for the key until a server answers (granted, or busy: the data
    // survived), noting whether the lease was reported lost when it asked.
    let asking = tokio::spawn(async move {
        loop {
            let lost = signal.is_lost();
            let sent = Instant::now();
            match second.lock("k").try_acquire().await {
                Err(LockError::Backend(_)) => tokio::time::sleep(Duration::from_millis(5)).await,
                answered => return (sent, lost, answered.is_ok()),
            }
        }
    });
    let (sent, lost, granted) = timeout(Duration::from_secs(20), asking)
        .await
        .expect("the restarted node answers")
        .unwrap();
    assert!(
        lost,
        "the restarted node that joined after build() answered (granted: {granted}) an acquire sent {:?} after the kill, before the holder's lease was reported lost",
        sent - killed
    );
    drop(lease);
    drop(joined);
    let _ = std::fs::remove_dir_all(&dir);
}
