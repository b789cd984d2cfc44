#![doc = include_str!("README.md")]

mod acquire;
mod backend;
mod builder;
mod capabilities;
// Each optional backend is gated once, here: its module holds its constructor, its
// connections and (for a cluster) its subscriber task.
#[cfg(feature = "redis-cluster")]
mod cluster;
mod commands;
mod conn;
mod connector;
mod contended;
mod layout;
mod names;
mod pool;
mod records;
mod release;
mod revocation;
mod runtime_conns;
mod script_call;
mod scripts;
#[cfg(feature = "redis-sentinel")]
mod sentinel;
mod server_checks;
mod session;
mod tls;
mod wakeup;

use std::{fmt, sync::Arc, time::Duration};

/// The redis-rs crate the backend is built on (1.x): name its `Client` and
/// `ConnectionInfo` through this path for [`RedisBackend::from_client`] and
/// [`RedisBackend::from_connection_info`], and no version mismatch can arise.
pub use ::redis;
pub use builder::RedisBackendBuilder;
use builder::Server;

use self::{commands::Commands, wakeup::Wakeup};
use super::{KeyError, LockError, LockKey};
use crate::{BackendError, BackendErrorKind};

/// The default key prefix.
pub const DEFAULT_PREFIX: &str = "tower-lock";
/// The longest prefix accepted, in bytes.
pub const MAX_PREFIX_LEN: usize = 64;
/// The longest command timeout (and `replica_ack` timeout) accepted: one hour. Longer ones
/// are refused by [`RedisBackendBuilder::build`] with a configuration error (they would
/// make a waiter's claim period, three times the timeout, last days).
pub const MAX_COMMAND_TIMEOUT: Duration = Duration::from_secs(60 * 60);
/// Waiters retry at least this often, whatever the pub/sub connection does.
pub(super) const FALLBACK_CAP: Duration = Duration::from_millis(250);
/// How long a fence tombstone lives after its release (and a hand-off's fence after the
/// claim it granted), on every path.
const FENCE_MARGIN: Duration = Duration::from_secs(10);
/// Leases renewed per script call.
const RENEW_CHUNK: usize = 256;

/// The Redis backend: see the [module docs](self) for the key layout, the scripts and the
/// failure behaviour. Cheap to clone; clones share the pool and the subscriber.
#[derive(Clone)]
pub struct RedisBackend {
    inner: Arc<Inner>,
}

struct Inner {
    commands: Commands,
    wakeup: Wakeup,
    prefix: String,
    /// How long a waiter's ticket lives unrefreshed, in ms; also the claim period of a
    /// hand-off to this node's waiters (how long a waiter that has gone can hold the key it
    /// was handed), which their tickets carry to whichever node releases.
    ticket_ttl_ms: u64,
    /// `WAIT` behind every acquire script, if configured.
    replica_ack: Option<commands::ReplicaAck>,
    /// On a Redis Cluster: sharded wake-up channels, one script call per slot.
    cluster: bool,
    /// The keys seen contended lately: their acquire looks at the lock first.
    contended: contended::Contended,
    /// Where the watch on the server(s) reports resets (see [`session`]).
    resets: crate::Resets,
    /// The watch (a [`session::Session`], or a Cluster's watch connection); dropped with
    /// the backend.
    _watch: Box<dyn std::any::Any + Send + Sync>,
}

impl Inner {
    fn names<'a>(&'a self, key: &'a LockKey) -> names::Names<'a> {
        names::Names::new(&self.prefix, key, self.cluster)
    }
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field("prefix", &self.inner.prefix)
            .field("replica_ack", &self.inner.replica_ack)
            .finish_non_exhaustive()
    }
}

impl RedisBackend {
    /// A builder for `url` (`redis://host:port/db`; `rediss://…` with the `redis-tls`
    /// feature).
    #[must_use]
    pub fn builder(url: impl Into<String>) -> RedisBackendBuilder {
        RedisBackendBuilder::new(Arc::new(Server::Url(url.into())))
    }

    /// A builder over a [`redis::Client`] the application already configured: its address,
    /// database, credentials, protocol and TLS settings (for example a client from
    /// `redis::Client::build_with_tls` with the application's own root certificate, under
    /// the `redis-tls` feature) are used as they are. The backend opens its own connections
    /// from it (a pool, and one subscriber connection).
    #[must_use]
    pub fn from_client(client: redis::Client) -> RedisBackendBuilder {
        RedisBackendBuilder::new(Arc::new(Server::Client(Box::new(client))))
    }

    /// A builder over connection settings the application already has (host, port,
    /// database, username, password, TLS): [`redis::ConnectionInfo`].
    #[must_use]
    pub fn from_connection_info(info: redis::ConnectionInfo) -> RedisBackendBuilder {
        RedisBackendBuilder::new(Arc::new(Server::Info(Box::new(info))))
    }

    /// Connect with the defaults: prefix `"tower-lock"`, 500 ms timeout, 16 connections.
    ///
    /// # Errors
    ///
    /// As [`RedisBackendBuilder::build`].
    pub async fn connect(url: impl Into<String>) -> Result<Self, BackendError> {
        Self::builder(url).build().await
    }

    /// The key prefix.
    #[must_use]
    pub fn prefix(&self) -> &str {
        &self.inner.prefix
    }
}

fn malformed_member(e: KeyError) -> LockError {
    LockError::Backend(
        BackendError::new(
            BackendErrorKind::Protocol,
            "stored pool member is malformed",
        )
        .with_source(e),
    )
}

fn malformed_token(e: KeyError) -> LockError {
    LockError::Backend(
        BackendError::new(BackendErrorKind::Protocol, "stored token is malformed").with_source(e),
    )
}

/// Milliseconds, rounded up, at least 1: a lease is never shorter on the server than asked.
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_nanos().div_ceil(1_000_000))
        .unwrap_or(u64::MAX)
        .max(1)
}

/// A remaining TTL reported by a script (`< 0`: none).
fn remaining(pttl: i64) -> Option<Duration> {
    u64::try_from(pttl).ok().map(Duration::from_millis)
}

fn outcome(code: i64) -> Result<(), LockError> {
    match code {
        -1 => Err(LockError::NotOwned),
        -2 | 0 => Err(LockError::Expired),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn millis_round_up() {
        assert_eq!(millis(Duration::from_micros(1)), 1);
        assert_eq!(millis(Duration::from_micros(1500)), 2);
        assert_eq!(millis(Duration::ZERO), 1);
    }
}
