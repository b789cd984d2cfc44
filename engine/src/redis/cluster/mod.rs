//! Redis Cluster (feature `redis-cluster`, gated once, where this module is declared):
//! [`RedisBackend::cluster`], the cluster connection every command goes through, the
//! sharded pub/sub subscriber (`subscriber`) and the watch that follows the cluster's
//! topology (`watch`, one `node_watch` per node, what it knows of the topology in
//! `topology`, the node watches asking each other in `peers`).

mod node_watch;
mod peers;
mod subscriber;
mod topology;
mod watch;

use std::{sync::Arc, time::Duration};

use redis::{cluster::ClusterClientBuilder, cluster_async::ClusterConnection};
use tokio::time::Instant;

use super::{
    RedisBackend, RedisBackendBuilder,
    builder::Target,
    commands::{Commands, Conn, Connections, map_error},
    wakeup::Subscriber,
};
use crate::{BackendError, BackendErrorKind, BoxFuture, ConfigError, Resets, runtime};

impl RedisBackend {
    /// A builder for a Redis Cluster, given the URLs of some of its nodes
    /// (`redis://host:port`; the others are discovered). Commands go to each lock's slot
    /// through redis-rs's cluster client, wake-ups use sharded pub/sub; see the
    /// [module docs](super#redis-cluster) for what differs from one server. The pool size
    /// does not apply: the cluster client keeps one multiplexed connection per node.
    #[must_use]
    pub fn cluster<I, S>(nodes: I) -> RedisBackendBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let nodes = nodes.into_iter().map(Into::into).collect();
        RedisBackendBuilder::new(Arc::new(Nodes(nodes)))
    }
}

/// Some of a cluster's nodes (redis-rs discovers the others).
#[derive(Debug)]
struct Nodes(Vec<String>);

impl Target for Nodes {
    fn connect(
        &self,
        timeout: Duration,
        _pool_size: u32,
    ) -> BoxFuture<'_, Result<(Commands, Subscriber), BackendError>> {
        Box::pin(connect(&self.0, timeout))
    }

    fn is_cluster(&self) -> bool {
        true
    }

    fn uses_tls(&self) -> bool {
        self.0.iter().any(|url| super::tls::is_tls_url(url))
    }

    fn watch(
        &self,
        timeout: Duration,
        resets: Resets,
        revoke: String,
    ) -> BoxFuture<'_, Result<Option<Box<dyn std::any::Any + Send + Sync>>, BackendError>> {
        Box::pin(async move {
            let watch = watch::Watch::start(&self.0, timeout, resets, revoke).await?;
            Ok(Some(Box::new(watch) as Box<dyn std::any::Any + Send + Sync>))
        })
    }
}

/// One cluster connection for commands (redis-rs keeps one multiplexed connection per node
/// behind it, so there is no pool); the subscriber makes its own RESP3 one.
async fn connect(
    nodes: &[String],
    timeout: Duration,
) -> Result<(Commands, Subscriber), BackendError> {
    let builder = {
        let nodes = nodes.to_vec();
        move || {
            // redis-rs waits 1.28 s at least before it retries a command that met a moved
            // slot or a dead node (defaults made for no command timeout): longer than a
            // command timeout of a second, so after a failover every command routed by a
            // stale slot map would time out instead of following the refreshed map.
            // Retries start at 10 ms, back off exponentially and stay well inside the
            // command timeout.
            let retry_cap = u64::try_from(timeout.as_millis() / 4)
                .unwrap_or(u64::MAX)
                .max(20);
            ClusterClientBuilder::new(nodes.clone())
                .connection_timeout(timeout)
                .response_timeout(timeout)
                .min_retry_wait(10)
                .max_retry_wait(retry_cap)
                .retry_wait_formula(10, 2)
        }
    };
    let client = builder()
        .build()
        .map_err(|e| BackendError::from(ConfigError::ClusterUrls).with_source(e))?;
    // Made on the engine's runtime, where its driver task then lives (see
    // `runtime::on_engine`).
    let connect = runtime::on_engine(client.get_async_connection());
    let conn = match tokio::time::timeout(timeout, connect).await {
        Ok(Ok(conn)) => conn,
        Ok(Err(e)) => return Err(map_error("cluster connect", e)),
        Err(_) => {
            return Err(BackendError::new(
                BackendErrorKind::Timeout,
                format!("no redis cluster connection within {timeout:?}"),
            ));
        }
    };
    let subscriber = subscriber::new(move |push| {
        builder()
            .use_protocol(redis::ProtocolVersion::RESP3)
            .push_sender(push)
            .build()
    });
    Ok((Commands::new(conn, timeout), subscriber))
}

/// A cluster connection is its own source of connections: every call runs on a clone.
impl Connections for ClusterConnection {
    fn get<'a>(
        &'a self,
        _what: &'static str,
        _deadline: Instant,
    ) -> BoxFuture<'a, Result<Conn, BackendError>> {
        Box::pin(std::future::ready(Ok(Conn::new(self.clone()))))
    }

    // It reconnects by itself.
    fn retire(&self) {}
}
