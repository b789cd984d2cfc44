//! A primary and its replicas, each a `redis-server` of the test's own.
//!
//! ```ignore
//! let set = Replicated::start(1);
//! let backend = RedisBackend::builder(set.primary().url())
//!     .replica_ack(1, Duration::from_millis(200))
//!     .build()
//!     .await?;
//! set.replica(0).freeze(Duration::from_secs(1)); // a replica that acknowledges nothing
//! ```

use std::time::{Duration, Instant};

use super::RedisServer;

/// A primary with `n` replicas (`--replicaof`), all in sync once [`Replicated::start`]
/// returns.
#[derive(Debug)]
pub struct Replicated {
    primary: RedisServer,
    replicas: Vec<RedisServer>,
}

impl Replicated {
    /// Start a primary and `n` replicas of it, and wait until every replica is online.
    pub fn start(n: usize) -> Self {
        // Full syncs go over the socket both ways, at once: no RDB file is written (the
        // replica would otherwise rename what it received to `dump.rdb` in the working
        // directory) and no 5 s diskless delay is waited out.
        let primary = RedisServer::start_with(["--repl-diskless-sync-delay", "0"]);
        let port = primary.port().to_string();
        let replicas = (0..n)
            .map(|_| {
                RedisServer::start_with([
                    "--replicaof",
                    "127.0.0.1",
                    port.as_str(),
                    "--repl-diskless-load",
                    "on-empty-db",
                ])
            })
            .collect();
        let set = Self { primary, replicas };
        set.wait_in_sync();
        set
    }

    /// The primary.
    pub fn primary(&self) -> &RedisServer {
        &self.primary
    }

    /// Replica `i`.
    pub fn replica(&self, i: usize) -> &RedisServer {
        &self.replicas[i]
    }

    /// Block until every replica acknowledges a write: `WAIT n` behind a `SET` on one
    /// connection answers `n`. No event tells a client this, so it is polled.
    pub fn wait_in_sync(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        let n = self.replicas.len().to_string();
        loop {
            let acked = self.primary.cli_pipe(&[
                &["SET", "replicated-fixture-sync", "1"],
                &["WAIT", &n, "200"],
            ]);
            if acked.lines().last() == Some(n.as_str()) {
                return;
            }
            let info = self.primary.cli(["INFO", "replication"]);
            assert!(
                Instant::now() < deadline,
                "replicas never came online: {info}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
