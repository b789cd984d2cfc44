//! A Sentinel-managed primary of the test's own: a primary, one replica and three
//! Sentinels watching them under the name [`SERVICE`].
//!
//! ```ignore
//! let set = Sentineled::start();
//! let backend = RedisBackend::sentinel(set.sentinel_urls(), SERVICE).build().await?;
//! let promoted = set.kill_primary(); // Sentinels elect the replica
//! ```

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use super::{RedisServer, Replicated};

/// The name the Sentinels know the primary by.
pub const SERVICE: &str = "tower-lock-test";

/// A primary, its replica, and three Sentinels.
#[derive(Debug)]
pub struct Sentineled {
    servers: Replicated,
    sentinels: Vec<RedisServer>,
    dir: PathBuf,
}

impl Sentineled {
    /// Start the primary and replica, then three Sentinels, and wait until every Sentinel
    /// knows the replica and the other Sentinels.
    pub fn start() -> Self {
        let servers = Replicated::start(1);
        let dir = crate::scratch::dir("sentinel");
        // Down after 2 s without an answer: with 1 s, a busy machine has been seen to
        // fail straight back (a replica just promoted rewrites its config file, fsync
        // included, and some Sentinels, whose links to it were new, heard nothing for a
        // second and declared it down).
        let config = format!(
            "sentinel monitor {SERVICE} 127.0.0.1 {} 2\n\
             sentinel down-after-milliseconds {SERVICE} 2000\n\
             sentinel failover-timeout {SERVICE} 5000\n\
             sentinel parallel-syncs {SERVICE} 1\n",
            servers.primary().port()
        );
        let sentinels = (0..3)
            .map(|i| RedisServer::start_sentinel(&config, &dir.join(format!("sentinel-{i}.conf"))))
            .collect();
        let set = Self {
            servers,
            sentinels,
            dir,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ready = set.sentinels.iter().all(|s| {
                let info = s.cli(["SENTINEL", "MASTER", SERVICE]);
                field(&info, "num-slaves") == Some(1)
                    && field(&info, "num-other-sentinels") == Some(2)
            });
            if ready {
                return set;
            }
            assert!(Instant::now() < deadline, "the sentinels never met");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `redis://127.0.0.1:<port>` of every Sentinel.
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels.iter().map(RedisServer::url).collect()
    }

    /// The `i`th Sentinel, in the order of [`Sentineled::sentinel_urls`] (to
    /// [`suspend`](RedisServer::suspend) one, say).
    pub fn sentinel(&self, i: usize) -> &RedisServer {
        &self.sentinels[i]
    }

    /// The primary at the start.
    pub fn primary(&self) -> &RedisServer {
        self.servers.primary()
    }

    /// The replica at the start.
    pub fn replica(&self) -> &RedisServer {
        self.servers.replica(0)
    }

    /// Kill the primary (SIGKILL) and wait until the Sentinels have promoted the replica
    /// and name it. Returns it.
    pub fn kill_primary(&self) -> &RedisServer {
        self.primary().kill();
        let replica = self.replica();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            // Sentinel promotes with `CLIENT KILL TYPE normal`, which may close this very
            // `redis-cli`: not an answer, ask again.
            let promoted = replica
                .try_cli(["ROLE"])
                .is_some_and(|r| r.starts_with("master"));
            let named = self.sentinels.iter().all(|s| {
                let addr = s.cli(["SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE]);
                addr.lines().nth(1) == Some(replica.port().to_string().as_str())
            });
            if promoted && named {
                return replica;
            }
            assert!(Instant::now() < deadline, "the sentinels never failed over");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Start the primary killed by [`Sentineled::kill_primary`] again (empty: persistence
    /// is off) as a replica of the promoted one, as the configuration the Sentinels
    /// rewrite would have it (left to them, the conversion waits for their next `INFO`
    /// of it, up to 10 s), and wait until it is in sync (`master_link_status:up`).
    /// Returns it.
    pub fn rejoin_old_primary(&self) -> &RedisServer {
        let old = self.primary();
        old.restart();
        // Load the full sync from the socket, as the fixture's replicas do: not through a
        // `dump.rdb` written into the test's working directory.
        let load = ["CONFIG", "SET", "repl-diskless-load", "on-empty-db"];
        assert_eq!(old.cli(load), "OK");
        let port = self.replica().port().to_string();
        assert_eq!(old.cli(["REPLICAOF", "127.0.0.1", &port]), "OK");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let info = old.cli(["INFO", "replication"]);
            let following = info.contains("role:slave")
                && info.contains(&format!("master_port:{}", self.replica().port()))
                && info.contains("master_link_status:up");
            if following {
                return old;
            }
            assert!(
                Instant::now() < deadline,
                "the old primary never rejoined as a replica: {info}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// A numeric field of `SENTINEL MASTER`'s answer (alternating name and value lines).
fn field(info: &str, name: &str) -> Option<u64> {
    let lines: Vec<&str> = info.lines().collect();
    lines
        .iter()
        .position(|l| *l == name)
        .and_then(|i| lines.get(i + 1))
        .and_then(|v| v.parse().ok())
}

impl Drop for Sentineled {
    fn drop(&mut self) {
        self.sentinels.clear();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
