//! A Redis Cluster of the test's own: six `redis-server`s (three primaries, three
//! replicas) on free loopback ports, each in its own directory.
//!
//! ```ignore
//! let cluster = RedisCluster::shared(); // one per test binary
//! let backend = RedisBackend::cluster(cluster.urls()).build().await?;
//! cluster.failover_slot_of("some-key"); // CLUSTER FAILOVER on the key's primary's replica
//! ```
//!
//! Starting one takes a few seconds (the nodes meet, then agree on the slots), so test
//! binaries share one and keep apart by key prefix.

use std::{
    path::PathBuf,
    process::{Command, Stdio},
    sync::{Arc, OnceLock},
    time::{Duration, Instant},
};

use super::RedisServer;

/// Six nodes, each slot served by one primary and one replica.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    dir: PathBuf,
}

impl RedisCluster {
    /// Start six nodes, form the cluster and wait until every node reports it healthy.
    pub fn start() -> Self {
        let dir = crate::scratch::dir("cluster");
        let nodes: Vec<RedisServer> = (0..6)
            .map(|i| {
                let node_dir = dir.join(i.to_string());
                std::fs::create_dir_all(&node_dir).expect("create a node directory");
                RedisServer::start_with([
                    "--cluster-enabled".to_owned(),
                    "yes".to_owned(),
                    "--dir".to_owned(),
                    node_dir.to_string_lossy().into_owned(),
                    // Failure detection in a test's time, not the default 15 s.
                    "--cluster-node-timeout".to_owned(),
                    "1000".to_owned(),
                    "--repl-diskless-sync-delay".to_owned(),
                    "0".to_owned(),
                    "--repl-diskless-load".to_owned(),
                    "on-empty-db".to_owned(),
                ])
            })
            .collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        let out = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .expect("run redis-cli --cluster create");
        assert!(out.status.success(), "cluster create failed: {out:?}");
        let cluster = Self { nodes, dir };
        cluster.wait_healthy();
        cluster
    }

    /// One cluster per test binary, started on first use, killed when the process exits.
    pub fn shared() -> &'static Arc<Self> {
        static SHARED: OnceLock<Arc<RedisCluster>> = OnceLock::new();
        SHARED.get_or_init(|| Arc::new(Self::start()))
    }

    /// `redis://127.0.0.1:<port>` of every node.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// Every node.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// The nodes that are primaries now.
    pub fn primaries(&self) -> Vec<&RedisServer> {
        self.nodes
            .iter()
            .filter(|n| n.try_cli(["ROLE"]).is_some_and(|r| r.starts_with("master")))
            .collect()
    }

    /// Every key matching `pattern` on every primary (SCAN, not KEYS).
    pub fn scan(&self, pattern: &str) -> Vec<String> {
        self.nodes
            .iter()
            .filter(|n| n.try_cli(["ROLE"]).is_some_and(|r| r.starts_with("master")))
            .flat_map(|n| n.scan(pattern))
            .collect()
    }

    /// The slot of `key` (`CLUSTER KEYSLOT`).
    pub fn slot(&self, key: &str) -> u16 {
        self.nodes[0]
            .cli(["CLUSTER", "KEYSLOT", key])
            .parse()
            .unwrap()
    }

    /// The node serving `slot` as primary now.
    pub fn primary_of(&self, slot: u16) -> &RedisServer {
        self.node_with_role(slot, true)
    }

    /// The node replicating `slot` now.
    pub fn replica_of(&self, slot: u16) -> &RedisServer {
        self.node_with_role(slot, false)
    }

    fn node_with_role(&self, slot: u16, primary: bool) -> &RedisServer {
        for node in &self.nodes {
            // A killed node answers nothing and serves nothing.
            let Some(role) = node.try_cli(["ROLE"]) else {
                continue;
            };
            let is_primary = role.starts_with("master");
            if is_primary != primary {
                continue;
            }
            let owner = if primary {
                node
            } else {
                // A replica's primary: ROLE answers "slave\nhost\nport\n…".
                let port: u16 = role.lines().nth(2).and_then(|p| p.parse().ok()).unwrap();
                self.nodes.iter().find(|n| n.port() == port).unwrap()
            };
            if owns(owner, slot) {
                return node;
            }
        }
        panic!(
            "no {} for slot {slot}",
            if primary { "primary" } else { "replica" }
        );
    }

    /// `CLUSTER FAILOVER` on the replica of `slot`: it and its primary swap roles without
    /// losing writes. Returns once every node agrees on the new primary.
    pub fn failover(&self, slot: u16) {
        let replica = self.replica_of(slot);
        assert_eq!(replica.cli(["CLUSTER", "FAILOVER"]), "OK");
        let deadline = Instant::now() + Duration::from_secs(20);
        while !replica.cli(["ROLE"]).starts_with("master") {
            assert!(Instant::now() < deadline, "the failover never happened");
            std::thread::sleep(Duration::from_millis(20));
        }
        self.wait_healthy();
    }

    /// Kill the primary of `slot` (SIGKILL) and wait until its replica has taken over and
    /// the surviving nodes report the cluster healthy again. Returns the new primary.
    pub fn kill_primary(&self, slot: u16) -> &RedisServer {
        let replica = self.replica_of(slot);
        self.primary_of(slot).kill();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let promoted = replica.cli(["ROLE"]).starts_with("master");
            let ok = self
                .nodes
                .iter()
                .filter_map(|n| n.try_cli(["CLUSTER", "INFO"]))
                .all(|info| info.contains("cluster_state:ok"));
            if promoted && ok {
                return replica;
            }
            assert!(Instant::now() < deadline, "the replica never took over");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Block until every node reports `cluster_state:ok`, every replica is in sync with
    /// its primary (a `WAIT` before that answers 0: `replica_ack` would refuse the first
    /// grants), and `redis-cli --cluster check` finds all nodes agreeing on the slots. No
    /// event tells a client this, so it is polled.
    pub fn wait_healthy(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ok = self.nodes.iter().all(|n| {
                n.cli(["CLUSTER", "INFO"]).contains("cluster_state:ok") && replication_up(n)
            });
            let check = Command::new("redis-cli")
                .args([
                    "--cluster",
                    "check",
                    &format!("127.0.0.1:{}", self.nodes[0].port()),
                ])
                .stdin(Stdio::null())
                .output()
                .expect("run redis-cli --cluster check");
            let report = String::from_utf8_lossy(&check.stdout).into_owned();
            if ok
                && report.contains("All nodes agree about slots configuration")
                && report.contains("All 16384 slots covered")
            {
                return;
            }
            assert!(Instant::now() < deadline, "cluster never healthy: {report}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Whether `node`'s replication is up: a primary with an online replica, or a replica
/// whose link to its primary is up.
fn replication_up(node: &RedisServer) -> bool {
    let Some(info) = node.try_cli(["INFO", "replication"]) else {
        return false;
    };
    if info.contains("role:master") {
        info.contains("connected_slaves:1") && info.contains("state=online")
    } else {
        info.contains("master_link_status:up")
    }
}

/// Whether `node` serves `slot` as primary (`CLUSTER SLOTS`, seen from the node itself).
fn owns(node: &RedisServer, slot: u16) -> bool {
    let (Some(myself), Some(shards)) = (
        node.try_cli(["CLUSTER", "MYID"]),
        node.try_cli(["CLUSTER", "NODES"]),
    ) else {
        return false;
    };
    shards.lines().any(|line| {
        let fields: Vec<&str> = line.split(' ').collect();
        fields.first() == Some(&myself.as_str())
            && fields.get(2).is_some_and(|f| f.contains("master"))
            && fields.iter().skip(8).any(|range| {
                let (lo, hi) = range.split_once('-').unwrap_or((range, range));
                matches!((lo.parse::<u16>(), hi.parse::<u16>()), (Ok(lo), Ok(hi)) if lo <= slot && slot <= hi)
            })
    })
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        self.nodes.clear();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
