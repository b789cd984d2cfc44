//! The backend a scenario runs on, and the lock table it gets there.

use std::sync::Arc;

use tower_lock::{LockEngine, LockLayer, LockLayerBuilder, MemoryBackend};

use super::{header_key, until_free};

/// The backend a scenario's engines run on.
#[derive(Clone, Copy, Debug)]
pub enum Backend {
    /// The in-process backend: one lock table per scenario.
    InProcess,
    /// The Redis backend on the test binary's shared redis-server: one key prefix per
    /// table, so per scenario instance.
    #[cfg(feature = "redis")]
    Redis,
    /// The Redis backend on the test binary's shared Redis Cluster: one key prefix per
    /// table, so per scenario instance.
    #[cfg(feature = "redis-cluster")]
    RedisCluster,
    /// The Postgres backend on the test binary's shared cluster: one schema per table, so
    /// per scenario instance.
    #[cfg(feature = "postgres")]
    Postgres,
    /// The Postgres backend through the test binary's PgBouncer in transaction pooling
    /// mode (its listener connected directly): one schema per table.
    #[cfg(feature = "postgres")]
    PostgresBouncer,
}

/// One scenario's lock table: its engine, and what it leaves behind.
#[derive(Debug)]
pub struct LockTable {
    engine: LockEngine,
    place: Place,
}

#[derive(Debug)]
enum Place {
    InProcess(Arc<MemoryBackend>),
    #[cfg(feature = "redis")]
    Redis {
        server: Arc<crate::redis::RedisServer>,
        prefix: String,
        timeout: Option<std::time::Duration>,
    },
    #[cfg(feature = "redis-cluster")]
    RedisCluster {
        prefix: String,
    },
    #[cfg(feature = "postgres")]
    Postgres(super::postgres::PgPlace),
}

impl Backend {
    /// A fresh lock table for the scenario `name`, apart from every other table: in
    /// process a table of its own; on the shared server or cluster a key prefix of its own
    /// (`scenario-{name}-…`, [`prefix::unique`](crate::prefix::unique)), so two tables made
    /// with one name (one scenario instantiated twice, run at once) never share a lock or a
    /// residue check.
    pub async fn table(self, name: &str) -> LockTable {
        match self {
            Self::InProcess => {
                // A table of its own: no name needed to keep apart.
                let _ = name;
                let backend = Arc::new(MemoryBackend::new());
                LockTable {
                    engine: LockEngine::from_arc(backend.clone()),
                    place: Place::InProcess(backend),
                }
            }
            #[cfg(feature = "redis")]
            Self::Redis => {
                let server = crate::redis::RedisServer::shared().clone();
                let prefix = crate::prefix::unique(&format!("scenario-{name}"));
                LockTable::on_redis(server, &prefix, None).await
            }
            #[cfg(feature = "redis-cluster")]
            Self::RedisCluster => {
                let prefix = crate::prefix::unique(&format!("scenario-{name}"));
                LockTable {
                    engine: cluster_engine(&prefix).await,
                    place: Place::RedisCluster { prefix },
                }
            }
            #[cfg(feature = "postgres")]
            Self::Postgres | Self::PostgresBouncer => {
                // The name is kept in the messages: a schema name is too short for it.
                let _ = name;
                let bouncer = matches!(self, Self::PostgresBouncer);
                let (engine, place) = super::postgres::PgPlace::new(bouncer).await;
                LockTable {
                    engine,
                    place: Place::Postgres(place),
                }
            }
        }
    }
}

impl LockTable {
    /// The keys under `prefix` on `server`, through engines with the backend's default
    /// command timeout or `timeout`. The prefix is used as given: for a server of the
    /// test's own; on a shared one, make it with [`prefix::unique`](crate::prefix::unique).
    #[cfg(feature = "redis")]
    pub async fn on_redis(
        server: Arc<crate::redis::RedisServer>,
        prefix: &str,
        timeout: Option<std::time::Duration>,
    ) -> Self {
        Self {
            engine: crate::redis::engine(&server, prefix, timeout).await,
            place: Place::Redis {
                server,
                prefix: prefix.to_owned(),
                timeout,
            },
        }
    }

    /// The scenario's engine.
    pub fn engine(&self) -> LockEngine {
        self.engine.clone()
    }

    /// A layer on the scenario's engine, keyed on the `x-key` header ([`header_key`]).
    pub fn layer(&self) -> LockLayerBuilder {
        LockLayer::builder(self.engine()).key(header_key())
    }

    /// The engine of another node of a fleet on this table: on Redis an engine of its own
    /// (its own pool and subscriber) on the same keys; in process, the same engine (one
    /// process has one table).
    pub async fn node(&self) -> LockEngine {
        match &self.place {
            Place::InProcess(_) => self.engine.clone(),
            #[cfg(feature = "redis")]
            Place::Redis {
                server,
                prefix,
                timeout,
            } => crate::redis::engine(server, prefix, *timeout).await,
            #[cfg(feature = "redis-cluster")]
            Place::RedisCluster { prefix } => cluster_engine(prefix).await,
            #[cfg(feature = "postgres")]
            Place::Postgres(place) => place.node().await,
        }
    }

    /// A layer on [another node](Self::node)'s engine, keyed on the `x-key` header.
    pub async fn node_layer(&self) -> LockLayerBuilder {
        LockLayer::builder(self.node().await).key(header_key())
    }

    /// Once the requests are done, nothing is left of the table but `records` stored
    /// responses (and, on Redis, fence tombstones with a TTL). Each of `keys` is first
    /// taken and released, as in [`assert_no_residue`](Self::assert_no_residue).
    pub async fn assert_only_records(&self, keys: &[String], records: usize) {
        for key in keys {
            until_free(&self.engine, key).await;
        }
        match &self.place {
            Place::InProcess(backend) => {
                let left = backend.key_count();
                assert_eq!(left, records, "entries left in the in-process table");
            }
            #[cfg(feature = "redis")]
            Place::Redis { server, prefix, .. } => {
                let left = tokio::task::block_in_place(|| crate::redis::residue(server, prefix));
                let (recs, other): (Vec<_>, Vec<_>) =
                    left.into_iter().partition(|k| k.contains("}:rec:"));
                assert!(other.is_empty(), "residue under {prefix}: {other:?}");
                assert_eq!(recs.len(), records, "records under {prefix}: {recs:?}");
                for rec in recs {
                    let ttl: i64 = server.cli(["PTTL", &rec]).parse().unwrap();
                    assert!(ttl > 0, "record {rec} has no TTL ({ttl})");
                }
            }
            #[cfg(feature = "redis-cluster")]
            Place::RedisCluster { prefix } => {
                let cluster = crate::redis::RedisCluster::shared();
                let mut recs = 0;
                for node in cluster.primaries() {
                    let left = tokio::task::block_in_place(|| crate::redis::residue(node, prefix));
                    let (rec, other): (Vec<_>, Vec<_>) =
                        left.into_iter().partition(|k| k.contains("}:rec:"));
                    assert!(other.is_empty(), "residue under {prefix}: {other:?}");
                    for rec in &rec {
                        let ttl: i64 = node.cli(["PTTL", rec]).parse().unwrap();
                        assert!(ttl > 0, "record {rec} has no TTL ({ttl})");
                    }
                    recs += rec.len();
                }
                assert_eq!(recs, records, "records under {prefix}");
            }
            #[cfg(feature = "postgres")]
            Place::Postgres(place) => {
                let (other, recs) = place.residue().await;
                let schema = place.schema();
                assert!(other.is_empty(), "residue in schema {schema}: {other:?}");
                assert_eq!(recs.len(), records, "records in schema {schema}: {recs:?}");
            }
        }
    }

    /// Once the requests are done, nothing is left of the table (on Redis: nothing but
    /// fence tombstones, each with a TTL). Each of `keys` is first taken and released
    /// through the engine, which waits (event-driven, well under any lease TTL) for
    /// releases still in flight.
    pub async fn assert_no_residue(&self, keys: &[String]) {
        for key in keys {
            until_free(&self.engine, key).await;
        }
        match &self.place {
            Place::InProcess(backend) => {
                let left = backend.key_count();
                assert_eq!(left, 0, "{left} entries left in the in-process table");
            }
            #[cfg(feature = "redis")]
            Place::Redis { server, prefix, .. } => {
                let left = tokio::task::block_in_place(|| crate::redis::residue(server, prefix));
                assert!(left.is_empty(), "residue under {prefix}: {left:?}");
            }
            #[cfg(feature = "redis-cluster")]
            Place::RedisCluster { prefix } => {
                let cluster = crate::redis::RedisCluster::shared();
                for node in cluster.primaries() {
                    let left = tokio::task::block_in_place(|| crate::redis::residue(node, prefix));
                    assert!(left.is_empty(), "residue under {prefix}: {left:?}");
                }
            }
            #[cfg(feature = "postgres")]
            Place::Postgres(place) => {
                let (other, recs) = place.residue().await;
                let schema = place.schema();
                assert!(other.is_empty(), "residue in schema {schema}: {other:?}");
                assert!(recs.is_empty(), "records in schema {schema}: {recs:?}");
            }
        }
    }
}

/// An engine (a node of its own) on the binary's shared test cluster, under `prefix`.
#[cfg(feature = "redis-cluster")]
async fn cluster_engine(prefix: &str) -> LockEngine {
    let cluster = tokio::task::spawn_blocking(crate::redis::RedisCluster::shared)
        .await
        .unwrap();
    let backend = tower_lock_engine::redis::RedisBackend::cluster(cluster.urls())
        .prefix(prefix)
        .build()
        .await
        .expect("connect to the test cluster");
    LockEngine::new(backend)
}
