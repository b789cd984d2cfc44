//! The Cluster's watch: one [`NodeWatch`] per node of the cluster's topology, which it
//! follows as the nodes come and go.
//!
//! The nodes watched are those `CLUSTER SLOTS` names (every slot's primary and replicas,
//! as redis-rs's cluster client sees them), read first from the seed URLs and then every
//! [`TOPOLOGY`] from a node already watched, a different one first each poll. A node that
//! appears is watched from then on: a replica added to a shard is watched from the poll
//! after it became a replica, long before a failover can make it a primary, so its crash
//! and empty restart are reported the moment its connection drops, before it answers
//! anyone. redis-rs refreshes its own slot map only when a command meets a redirect, so
//! the watch cannot borrow it.
//!
//! Which answers are believed, and when a node is no longer watched, is `topology`'s: an
//! empty answer tells nothing, a node is dropped only once answers from two different
//! nodes have left it out, and never every node. When no watched node tells the topology,
//! the seeds are asked again.

use std::{collections::HashMap, time::Duration};

use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo, Value};

use super::{
    node_watch::NodeWatch,
    peers::Peers,
    topology::{Addr, Answer, Topology, parse},
};
use crate::{BackendError, BackendErrorKind, ConfigError, Resets, runtime};

/// How often the topology is read: a node added to the cluster is watched at most this
/// long (plus a connect) after the node asked names it.
pub(super) const TOPOLOGY: Duration = Duration::from_secs(1);

/// The watch on every node; dropping it ends every node's watch.
pub(super) struct Watch {
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The nodes watched.
struct Nodes {
    /// The seeds' connection settings (credentials, TLS, RESP3), to which each node's
    /// address is applied.
    template: ConnectionInfo,
    timeout: Duration,
    resets: Resets,
    /// The prefix's revocation channel, which each node watch subscribes to.
    revoke: std::sync::Arc<str>,
    /// Asked again when no watched node tells the topology.
    seeds: Vec<String>,
    topology: Topology,
    watches: HashMap<Addr, NodeWatch>,
    /// Every node watch's connection, for one to ask the others.
    peers: Peers,
}

impl Watch {
    /// Watch every node of the cluster the `seeds` belong to, reporting on `resets`.
    /// Returns once each has been tried (within `timeout`); an error if no seed tells the
    /// topology.
    pub(super) async fn start(
        seeds: &[String],
        timeout: Duration,
        resets: Resets,
        revoke: String,
    ) -> Result<Self, BackendError> {
        let template = seeds
            .first()
            .ok_or_else(|| BackendError::from(ConfigError::ClusterUrls))?
            .as_str()
            .into_connection_info()
            .map_err(|e| BackendError::from(ConfigError::ClusterUrls).with_source(e))?;
        let settings = template
            .redis_settings()
            .clone()
            .set_protocol(redis::ProtocolVersion::RESP3);
        let template = template.set_redis_settings(settings);
        let mut nodes = Nodes {
            template,
            timeout,
            resets,
            revoke: revoke.into(),
            seeds: seeds.to_vec(),
            topology: Topology::default(),
            watches: HashMap::new(),
            peers: Peers::default(),
        };
        let (seed, answer) = runtime::on_engine(first_topology(seeds, timeout)).await?;
        nodes.follow(&seed, &answer);
        futures_util::future::join_all(nodes.watches.values().map(|w| w.tried(timeout))).await;
        let task = runtime::handle().spawn(async move {
            loop {
                tokio::time::sleep(TOPOLOGY).await;
                nodes.poll().await;
            }
        });
        Ok(Self { task })
    }
}

impl Nodes {
    /// Take in `answer` from `answered_by`: watch the nodes it adds, end the watch on those
    /// the topology no longer has.
    fn follow(&mut self, answered_by: &Addr, answer: &Answer) {
        let change = self.topology.follow(answered_by, answer);
        for addr in change.removed {
            tracing::debug!(
                host = addr.0,
                port = addr.1,
                "redis cluster watch: a node no longer watched"
            );
            self.watches.remove(&addr);
        }
        for addr in change.added {
            tracing::debug!(
                host = addr.0,
                port = addr.1,
                "redis cluster watch: a node to watch"
            );
            let info = self
                .template
                .clone()
                .set_addr(address(&self.template, &addr));
            let watch = NodeWatch::start(
                addr.clone(),
                info,
                self.timeout,
                self.resets.clone(),
                self.revoke.clone(),
                self.peers.clone(),
            );
            self.watches.insert(addr, watch);
        }
        // Every node's role as of this answer: a node's drop is a reset unless it is a
        // replica (and still one, see `peers`).
        for (addr, watch) in &self.watches {
            watch.set_role(self.topology.role(addr));
        }
    }

    /// Read the topology from the first watched node that tells it, a different one first
    /// each poll; from the seeds if none does.
    async fn poll(&mut self) {
        for addr in self.topology.ask_order() {
            let Some(mut conn) = self.watches.get(&addr).and_then(NodeWatch::connection) else {
                continue;
            };
            let mut slots = redis::cmd("CLUSTER");
            slots.arg("SLOTS");
            match tokio::time::timeout(self.timeout, slots.query_async(&mut conn)).await {
                Ok(Ok(slots)) => {
                    let answer = parse(&slots, &addr.0);
                    if answer.is_informative() {
                        self.follow(&addr, &answer);
                        return;
                    }
                    tracing::debug!(
                        host = addr.0,
                        port = addr.1,
                        "redis cluster watch: a node that knows no slot"
                    );
                }
                Ok(Err(error)) => tracing::debug!(%error, "redis cluster watch: CLUSTER SLOTS"),
                Err(_) => {}
            }
        }
        match first_topology(&self.seeds, self.timeout).await {
            Ok((seed, answer)) => self.follow(&seed, &answer),
            Err(error) => tracing::debug!(%error, "no redis cluster node told the topology"),
        }
    }
}

/// The topology, from the first seed that tells it.
async fn first_topology(
    seeds: &[String],
    timeout: Duration,
) -> Result<(Addr, Answer), BackendError> {
    let mut last = None;
    for seed in seeds {
        let asked = async {
            let info = seed.as_str().into_connection_info()?;
            let seed: Addr = match info.addr() {
                ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
                    (host.clone(), *port)
                }
                _ => (String::new(), 0),
            };
            let mut conn = redis::Client::open(info)?
                .get_multiplexed_async_connection()
                .await?;
            let slots: Value = redis::cmd("CLUSTER")
                .arg("SLOTS")
                .query_async(&mut conn)
                .await?;
            let answer = parse(&slots, &seed.0);
            Ok::<_, redis::RedisError>((seed, answer))
        };
        match tokio::time::timeout(timeout, asked).await {
            Ok(Ok((seed, answer))) if answer.is_informative() => return Ok((seed, answer)),
            Ok(Err(e)) => last = Some(e),
            // No slots (yet, or after a reset), or no answer in time: the next seed.
            Ok(Ok(_)) | Err(_) => {}
        }
    }
    let error = BackendError::new(
        BackendErrorKind::Unavailable,
        format!(
            "redis cluster watch connect failed: no seed node told the topology within {timeout:?}"
        ),
    );
    Err(match last {
        Some(source) => error.with_source(source),
        None => error,
    })
}

/// `addr`, connected to as the seeds are (TLS with their settings, or plain TCP).
fn address(template: &ConnectionInfo, (host, port): &Addr) -> ConnectionAddr {
    match template.addr() {
        ConnectionAddr::TcpTls {
            insecure,
            tls_params,
            ..
        } => ConnectionAddr::TcpTls {
            host: host.clone(),
            port: *port,
            insecure: *insecure,
            tls_params: tls_params.clone(),
        },
        _ => ConnectionAddr::Tcp(host.clone(), *port),
    }
}
