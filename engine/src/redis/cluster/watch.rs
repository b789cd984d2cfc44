//! The Cluster's watch: one [`NodeWatch`] per node of the cluster's topology, which it
//! follows as the nodes come and go.
//!
//! The nodes watched are those `CLUSTER SLOTS` names (every slot's primary and replicas,
//! as redis-rs's cluster client sees them), read first from the seed URLs and then every
//! [`TOPOLOGY`] from a node already watched. A node that appears is watched from then on:
//! a replica added to a shard is watched from the poll after it became a replica, long
//! before a failover can make it a primary, so its crash and empty restart are reported
//! the moment its connection drops, before it answers anyone. redis-rs refreshes its own
//! slot map only when a command meets a redirect, so the watch cannot borrow it.
//!
//! A node that no poll names for [`ABSENT_POLLS`] polls in a row (removed, or a failed
//! node the cluster gave up on) is no longer watched; should it come back as a replica, it
//! is watched again. A node missing from one answer only (the answering node had not yet
//! heard of it) stays watched.

use std::{collections::HashMap, time::Duration};

use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo, Value};

use super::node_watch::NodeWatch;
use crate::{BackendError, BackendErrorKind, ConfigError, Resets, runtime};

/// How often the topology is read: a node added to the cluster is watched at most this
/// long (plus a connect) after the node asked names it.
pub(super) const TOPOLOGY: Duration = Duration::from_secs(1);

/// How many polls in a row must leave a node out before it is no longer watched.
const ABSENT_POLLS: u32 = 3;

/// The watch on every node; dropping it ends every node's watch.
pub(super) struct Watch {
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A node's address, as `CLUSTER SLOTS` gives it.
type Addr = (String, u16);

/// The nodes watched.
struct Nodes {
    /// The seeds' connection settings (credentials, TLS, RESP3), to which each node's
    /// address is applied.
    template: ConnectionInfo,
    timeout: Duration,
    resets: Resets,
    watches: HashMap<Addr, Watched>,
}

struct Watched {
    watch: NodeWatch,
    /// Polls in a row that left it out.
    absent: u32,
}

impl Watch {
    /// Watch every node of the cluster the `seeds` belong to, reporting on `resets`.
    /// Returns once each has been tried (within `timeout`); an error if no seed tells the
    /// topology.
    pub(super) async fn start(
        seeds: &[String],
        timeout: Duration,
        resets: Resets,
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
            watches: HashMap::new(),
        };
        let topology = runtime::on_engine(first_topology(seeds, timeout)).await?;
        nodes.follow(topology);
        futures_util::future::join_all(nodes.watches.values().map(|w| w.watch.tried(timeout)))
            .await;
        let task = runtime::handle().spawn(async move {
            loop {
                tokio::time::sleep(TOPOLOGY).await;
                match nodes.topology().await {
                    Some(topology) => nodes.follow(topology),
                    None => tracing::debug!("no watched redis cluster node told the topology"),
                }
            }
        });
        Ok(Self { task })
    }
}

impl Nodes {
    /// Watch the nodes of `topology` not yet watched; forget those it has left out for
    /// [`ABSENT_POLLS`] polls.
    fn follow(&mut self, topology: Vec<Addr>) {
        for watched in self.watches.values_mut() {
            watched.absent += 1;
        }
        for addr in topology {
            if let Some(watched) = self.watches.get_mut(&addr) {
                watched.absent = 0;
                continue;
            }
            tracing::debug!(
                host = addr.0,
                port = addr.1,
                "redis cluster watch: a node to watch"
            );
            let info = self
                .template
                .clone()
                .set_addr(address(&self.template, &addr));
            let watch = NodeWatch::start(info, self.timeout, self.resets.clone());
            self.watches.insert(addr, Watched { watch, absent: 0 });
        }
        self.watches
            .retain(|_, watched| watched.absent < ABSENT_POLLS);
    }

    /// The topology, as the first watched node to answer tells it.
    async fn topology(&self) -> Option<Vec<Addr>> {
        for ((host, _), watched) in &self.watches {
            let Some(mut conn) = watched.watch.connection() else {
                continue;
            };
            let mut slots = redis::cmd("CLUSTER");
            slots.arg("SLOTS");
            match tokio::time::timeout(self.timeout, slots.query_async(&mut conn)).await {
                Ok(Ok(slots)) => return Some(parse(&slots, host)),
                Ok(Err(error)) => tracing::debug!(%error, "redis cluster watch: CLUSTER SLOTS"),
                Err(_) => {}
            }
        }
        None
    }
}

/// The topology, from the first seed that tells it.
async fn first_topology(seeds: &[String], timeout: Duration) -> Result<Vec<Addr>, BackendError> {
    let mut last = None;
    for seed in seeds {
        let asked = async {
            let info = seed.as_str().into_connection_info()?;
            let host = match info.addr() {
                ConnectionAddr::Tcp(host, _) | ConnectionAddr::TcpTls { host, .. } => host.clone(),
                _ => String::new(),
            };
            let mut conn = redis::Client::open(info)?
                .get_multiplexed_async_connection()
                .await?;
            let slots: Value = redis::cmd("CLUSTER")
                .arg("SLOTS")
                .query_async(&mut conn)
                .await?;
            Ok::<_, redis::RedisError>(parse(&slots, &host))
        };
        match tokio::time::timeout(timeout, asked).await {
            Ok(Ok(topology)) if !topology.is_empty() => return Ok(topology),
            Ok(Err(e)) => last = Some(e),
            // No slots yet, or no answer in time: the next seed.
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

/// Every node a `CLUSTER SLOTS` reply names (primaries and replicas), once each. A node
/// with no host given is the answering node's host (`answered_by`); one with an unknown
/// address (`?`) is left out.
fn parse(slots: &Value, answered_by: &str) -> Vec<Addr> {
    let mut nodes: Vec<Addr> = Vec::new();
    let Value::Array(ranges) = slots else {
        return nodes;
    };
    for range in ranges {
        let Value::Array(range) = range else { continue };
        for node in range.iter().skip(2) {
            let Value::Array(node) = node else { continue };
            let host = match node.first() {
                Some(Value::BulkString(host)) => String::from_utf8_lossy(host).into_owned(),
                Some(Value::SimpleString(host)) => host.clone(),
                Some(Value::Nil) => String::new(),
                _ => continue,
            };
            let host = match host.as_str() {
                "?" => continue,
                "" | "0.0.0.0" | "::" => answered_by.to_owned(),
                _ => host,
            };
            let Some(Value::Int(port)) = node.get(1) else {
                continue;
            };
            let Ok(port) = u16::try_from(*port) else {
                continue;
            };
            if port != 0 && !nodes.iter().any(|(h, p)| *h == host && *p == port) {
                nodes.push((host, port));
            }
        }
    }
    nodes
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

#[cfg(test)]
mod tests {
    use super::*;

    fn node(host: &str, port: i64) -> Value {
        Value::Array(vec![
            Value::BulkString(host.as_bytes().to_vec()),
            Value::Int(port),
            Value::BulkString(b"id".to_vec()),
        ])
    }

    #[test]
    fn every_primary_and_replica_once_with_the_answering_host_for_a_missing_one() {
        let slots = Value::Array(vec![
            Value::Array(vec![
                Value::Int(0),
                Value::Int(10),
                node("10.0.0.1", 7000),
                node("", 7001),
            ]),
            Value::Array(vec![
                Value::Int(11),
                Value::Int(20),
                node("10.0.0.1", 7000),
                node("?", 7002),
            ]),
        ]);
        assert_eq!(
            parse(&slots, "seed"),
            vec![("10.0.0.1".to_owned(), 7000), ("seed".to_owned(), 7001)]
        );
    }
}
