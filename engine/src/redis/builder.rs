//! [`RedisBackendBuilder`]: validates the configuration, connects, loads the scripts.

use std::{fmt, sync::Arc, time::Duration};

use super::{
    DEFAULT_PREFIX, FALLBACK_CAP, Inner, MAX_COMMAND_TIMEOUT, MAX_PREFIX_LEN, RedisBackend,
    commands::{Commands, ReplicaAck},
    connector::{ClientSource, Connector},
    layout, millis,
    pool::ServerPool,
    scripts, server_checks,
    session::Session,
    tls,
    wakeup::{self, Subscriber, Wakeup},
};
use crate::{BackendError, BackendErrorKind, BoxFuture, ConfigError};

/// Builds a [`RedisBackend`]; see [`RedisBackend::builder`].
#[derive(Clone, Debug)]
pub struct RedisBackendBuilder {
    target: Arc<dyn Target>,
    prefix: String,
    command_timeout: Duration,
    pool_size: u32,
    replica_ack: Option<(usize, Duration)>,
    allow_evicting_policy: bool,
    start_before_redis: bool,
}

/// Where the backend connects: what the application handed to the constructor. Each kind
/// makes its own command connections and wake-up subscriber: one server (here), the
/// primary Sentinel names (`sentinel`), a Redis Cluster (`cluster`).
pub(super) trait Target: fmt::Debug + Send + Sync {
    /// The command connections, each call within `timeout`, and the subscriber; at most
    /// `pool_size` connections where they are pooled.
    fn connect(
        &self,
        timeout: Duration,
        pool_size: u32,
    ) -> BoxFuture<'_, Result<(Commands, Subscriber), BackendError>>;

    /// Whether it is a Redis Cluster: sharded wake-up channels, one script call per slot.
    fn is_cluster(&self) -> bool {
        false
    }

    /// Whether its connections speak TLS (then rustls needs a crypto provider: [`tls`]).
    fn uses_tls(&self) -> bool;

    /// A watch on the servers that reports a reset on `resets` the moment a connection to
    /// one of them drops, kept alive as long as what it returns (see [`session`](super::session));
    /// `None` where the kind watches through the command connector instead (one server,
    /// Sentinel).
    /// The watch also subscribes to `_revoke`, the prefix's revocation channel.
    fn watch(
        &self,
        _timeout: Duration,
        _resets: crate::Resets,
        _revoke: String,
    ) -> BoxFuture<'_, Result<Option<Box<dyn std::any::Any + Send + Sync>>, BackendError>> {
        Box::pin(std::future::ready(Ok(None)))
    }
}

/// One server: a URL, or a client or connection settings the application configured.
#[derive(Clone, Debug)]
pub(super) enum Server {
    Url(String),
    /// Boxed, as is the next: each is ten times the size of a URL.
    Client(Box<redis::Client>),
    Info(Box<redis::ConnectionInfo>),
}

impl Target for Server {
    fn connect(
        &self,
        timeout: Duration,
        pool_size: u32,
    ) -> BoxFuture<'_, Result<(Commands, Subscriber), BackendError>> {
        let client = match self.clone() {
            Self::Url(url) => redis::Client::open(url.as_str()),
            Self::Client(client) => Ok(*client),
            Self::Info(info) => redis::Client::open(*info),
        };
        Box::pin(async move {
            let client =
                client.map_err(|e| BackendError::from(ConfigError::InvalidUrl).with_source(e))?;
            Ok(one_server(Box::new(client), timeout, pool_size))
        })
    }

    fn uses_tls(&self) -> bool {
        match self {
            Self::Url(url) => tls::is_tls_url(url),
            Self::Client(client) => tls::is_tls(client.get_connection_info()),
            Self::Info(info) => tls::is_tls(info),
        }
    }
}

/// The command pool and the subscriber of one server whose address comes from `client`
/// (fixed, or the primary Sentinel names now): both connect through one [`Connector`], so
/// a failure either sees retires the other's connections too.
pub(super) fn one_server(
    client: Box<dyn ClientSource>,
    timeout: Duration,
    pool_size: u32,
) -> (Commands, Subscriber) {
    let connector = Arc::new(Connector::new(client, timeout));
    let pool = ServerPool::new(connector.clone(), pool_size, timeout);
    (Commands::server(pool, timeout), wakeup::single(connector))
}

impl RedisBackendBuilder {
    pub(super) fn new(target: Arc<dyn Target>) -> Self {
        Self {
            target,
            prefix: DEFAULT_PREFIX.to_owned(),
            command_timeout: Duration::from_millis(500),
            pool_size: 16,
            replica_ack: None,
            allow_evicting_policy: false,
            start_before_redis: false,
        }
    }

    /// Acquire only once at least `replicas` replicas acknowledged the grant, waiting at
    /// most `timeout` for them (default: off).
    ///
    /// Every acquire script is followed by `WAIT replicas timeout` on the same connection,
    /// in the same round trip (Redis refuses `WAIT` inside a script). A grant that fewer
    /// replicas acknowledged is released at once, and the acquire fails with a
    /// [`BackendErrorKind::NotReplicated`] error; so does a grant handed over by a release,
    /// which the new holder confirms with one more acquire call before it returns. An
    /// acquire may therefore take `timeout` longer than the command timeout.
    ///
    /// What it buys: a lease the acquire returned is on `replicas` replicas' memory, so a
    /// failover to one of them keeps it, narrowing the window in which a promoted replica
    /// hands out a key that is still held. What it does not: `WAIT` is not consensus. The
    /// promoted replica may be one that did not acknowledge; an acknowledged write is in a
    /// replica's memory, not on its disk; renewals, releases and waiter tickets are not
    /// waited for; and a primary that fails between the grant and the acknowledgement may
    /// leave the grant on a replica although the acquire failed (it then expires with its
    /// lease). Fencing tokens, checked by the storage that the lock protects, remain the
    /// guard against two holders.
    ///
    /// `replicas` must be at least 1 and `timeout` positive (a zero `WAIT` timeout would
    /// block forever) and at most [`MAX_COMMAND_TIMEOUT`].
    #[must_use]
    pub fn replica_ack(mut self, replicas: usize, timeout: Duration) -> Self {
        self.replica_ack = Some((replicas, timeout));
        self
    }

    /// The namespace of every Redis key and channel (default `"tower-lock"`): 1 to
    /// [`MAX_PREFIX_LEN`] bytes, no `{`, `}` or control characters.
    #[must_use]
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The limit on every Redis call, connection check-out included (default 500 ms); at
    /// most [`MAX_COMMAND_TIMEOUT`].
    #[must_use]
    pub fn command_timeout(mut self, timeout: Duration) -> Self {
        self.command_timeout = timeout;
        self
    }

    /// Accept a server whose `maxmemory-policy` may evict keys (default: refused).
    ///
    /// Every engine key has a TTL, so under memory pressure a `volatile-*` policy evicts
    /// held locks as readily as an `allkeys-*` one, and a second engine then acquires a key
    /// whose holder's lease still reports valid. [`build`](Self::build) therefore reads the
    /// policy (`CONFIG GET`, or `INFO memory` where `CONFIG` is renamed or refused) and
    /// refuses anything but `noeviction`, or a server that answers neither, with a
    /// [`BackendErrorKind::Config`] error. Opt in only for a server that cannot reach its
    /// `maxmemory` (or whose policy you vouch for but cannot let it read); fencing tokens
    /// checked by the storage are then the only guard against two holders.
    #[must_use]
    pub fn allow_evicting_policy(mut self, allow: bool) -> Self {
        self.allow_evicting_policy = allow;
        self
    }

    /// Whether [`build`](Self::build) may succeed while the server cannot be reached yet
    /// (default `false`: it fails, saying it cannot connect and to where).
    ///
    /// For a service whose Redis may start after it (a pod next to its Redis): the backend
    /// is built anyway, calls fail at once with an `Unavailable` error while the server is
    /// unreachable, one background probe looks for it, and calls work once it answers. The
    /// scripts are loaded on first use. The checks [`build`](Self::build) runs (eviction
    /// policy, channel rights) run on the first call that reaches the server, and no call
    /// goes through before they pass; a server or user they refuse fails every call with
    /// the [`BackendErrorKind::Config`] error `build()` would have given (logged once, at
    /// `error`). Configuration errors (a bad URL, prefix or timeout) are still refused. Not for a Redis Cluster, whose client needs a node to
    /// discover the others: its build still fails while none answers.
    #[must_use]
    pub fn start_before_redis(mut self, allow: bool) -> Self {
        self.start_before_redis = allow;
        self
    }

    /// How many multiplexed connections the pool keeps at most (default 16).
    #[must_use]
    pub fn pool_size(mut self, size: u32) -> Self {
        self.pool_size = size;
        self
    }

    /// Validate the configuration, connect, and check that the server answers.
    ///
    /// # Errors
    ///
    /// A [`BackendErrorKind::Config`] error, whose [`config`](BackendError::config) says
    /// which [`ConfigError`], for a bad URL, prefix, pool size or timeout, for a TLS
    /// address while no rustls crypto provider is installed for the process (feature
    /// `redis-tls`: install the one your application uses with
    /// `rustls::crypto::CryptoProvider::install_default`), for a server whose
    /// `maxmemory-policy` may evict keys (see
    /// [`allow_evicting_policy`](Self::allow_evicting_policy)), and for a user that may not
    /// subscribe to or publish on the engine's wake-up channels (`<prefix>:*`; checked with
    /// `ACL DRYRUN`, or by publishing where the user may not run `ACL`); an `Unavailable`
    /// or `Timeout` error when the server cannot be reached.
    pub async fn build(self) -> Result<RedisBackend, BackendError> {
        if self.prefix.is_empty()
            || self.prefix.len() > MAX_PREFIX_LEN
            || self
                .prefix
                .chars()
                .any(|c| c == '{' || c == '}' || c.is_control())
        {
            return Err(ConfigError::Prefix {
                prefix: self.prefix,
                max: MAX_PREFIX_LEN,
            }
            .into());
        }
        if self.pool_size == 0 {
            return Err(ConfigError::PoolSize.into());
        }
        if self.command_timeout.is_zero() || self.command_timeout > MAX_COMMAND_TIMEOUT {
            return Err(ConfigError::CommandTimeout {
                timeout: self.command_timeout,
                max: MAX_COMMAND_TIMEOUT,
            }
            .into());
        }
        let replica_ack = match self.replica_ack {
            None => None,
            Some((replicas, timeout)) => {
                let replicas = u32::try_from(replicas).unwrap_or(0);
                if replicas == 0 || timeout.is_zero() || timeout > MAX_COMMAND_TIMEOUT {
                    return Err(ConfigError::ReplicaAck {
                        max: MAX_COMMAND_TIMEOUT,
                    }
                    .into());
                }
                Some(ReplicaAck { replicas, timeout })
            }
        };
        if self.target.uses_tls() {
            tls::provider_installed()?;
        }
        let cluster = self.target.is_cluster();
        let (mut commands, subscriber) = self
            .target
            .connect(self.command_timeout, self.pool_size)
            .await?;
        // Load the scripts now, so first calls are one EVALSHA each (after a server restart
        // redis-rs reloads them on NOSCRIPT).
        match commands.load(&scripts::all()).await {
            // A server that would not keep what it is given, or a user that could neither
            // hear nor send grants, is refused now rather than found out under load.
            Ok(()) => {
                if !self.allow_evicting_policy {
                    server_checks::eviction(&commands).await?;
                }
                server_checks::channels(&commands, &self.prefix, cluster).await?;
                layout::check(&commands, &self.prefix, cluster).await?;
            }
            // Unreachable for now: the pool's probe looks for the server, and calls fail at
            // once until it answers (scripts are loaded then, on first use: `NOSCRIPT`).
            // The same checks run on the first call that reaches it, and no call gets
            // through before they pass.
            Err(e)
                if self.start_before_redis
                    && matches!(
                        e.kind(),
                        BackendErrorKind::Unavailable | BackendErrorKind::Timeout
                    ) =>
            {
                tracing::warn!(error = %e, "redis backend started before redis is reachable; its eviction policy and channel rights are checked once it answers");
                commands.defer_checks(server_checks::Deferred::new(
                    self.prefix.clone(),
                    cluster,
                    !self.allow_evicting_policy,
                ));
            }
            // Unreachable, and the service may not start before Redis does: say so, and how
            // to start anyway (nothing retries once `build` has returned).
            Err(e)
                if matches!(
                    e.kind(),
                    BackendErrorKind::Unavailable | BackendErrorKind::Timeout
                ) =>
            {
                let target = commands.connector().map_or_else(
                    || "the cluster's nodes".to_owned(),
                    |c| c.target().to_owned(),
                );
                let mut refused = BackendError::new(
                    e.kind(),
                    format!(
                        "cannot connect to {target} to build the backend; to start before Redis is up, build it with `start_before_redis(true)` (calls then fail at once until Redis answers)"
                    ),
                );
                if let Some(cause) = e.source_error() {
                    refused = refused.with_shared_source(cause);
                }
                return Err(refused);
            }
            Err(e) => return Err(e),
        }
        // A waiter's attempt takes up to the command timeout (plus the WAIT timeout):
        // three of them must fit in a ticket's life.
        let attempt = self.command_timeout + replica_ack.map_or(Duration::ZERO, |a| a.timeout);
        let ticket_ttl = (3 * (attempt + FALLBACK_CAP)).max(Duration::from_secs(3));
        // On one server (or Sentinel's primary), a watch on the server tells the engine the
        // moment it can no longer vouch for a lease.
        let resets = crate::Resets::new();
        let session: Box<dyn std::any::Any + Send + Sync> = match commands.connector() {
            Some(connector) => {
                let channel = layout::session_channel(&self.prefix);
                let revoke = super::revocation::channel(&self.prefix);
                let (session, watch) = Session::start(
                    connector,
                    channel,
                    revoke,
                    self.command_timeout,
                    resets.clone(),
                )
                .await;
                commands.watched_by(watch);
                Box::new(session)
            }
            None => match self
                .target
                .watch(
                    self.command_timeout,
                    resets.clone(),
                    super::revocation::channel(&self.prefix),
                )
                .await?
            {
                Some(watch) => watch,
                None => Box::new(()),
            },
        };
        Ok(RedisBackend {
            inner: Arc::new(Inner {
                resets,
                _watch: session,
                wakeup: Wakeup::new(subscriber, self.command_timeout),
                commands,
                prefix: self.prefix,
                ticket_ttl_ms: millis(ticket_ttl),
                replica_ack,
                cluster,
                contended: super::contended::Contended::new(),
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn misconfiguration_is_refused_at_build_time() {
        // Port 1: nothing listens, but none of these gets as far as connecting.
        let builder = || RedisBackend::builder("redis://127.0.0.1:1");
        for bad in [
            builder().prefix("a{b}"),
            builder().prefix(""),
            builder().prefix("x".repeat(MAX_PREFIX_LEN + 1)),
            builder().pool_size(0),
            builder().command_timeout(Duration::ZERO),
            builder().replica_ack(0, Duration::from_millis(100)),
            builder().replica_ack(1, Duration::ZERO),
            // Out of range: a typed error, never a panic.
            builder().command_timeout(Duration::MAX),
            builder().command_timeout(Duration::from_secs(u64::MAX / 4)),
            builder().replica_ack(1, Duration::MAX),
            builder()
                .command_timeout(Duration::MAX)
                .replica_ack(1, Duration::MAX),
            RedisBackend::builder("not a url"),
        ] {
            let err = bad.build().await.unwrap_err();
            assert_eq!(err.kind(), BackendErrorKind::Config, "{err}");
        }
        let err = builder().build().await.unwrap_err();
        assert_eq!(err.kind(), BackendErrorKind::Unavailable, "{err}");
    }

    /// `redis-tls` enables no rustls crypto provider: with none installed for the process,
    /// a TLS backend is a configuration error that says how to install one, before any
    /// connection (rustls would panic choosing one). Nothing in this test binary installs
    /// a provider.
    #[cfg(feature = "redis-tls")]
    #[tokio::test]
    async fn tls_without_a_crypto_provider_is_a_config_error_not_a_panic() {
        assert!(rustls::crypto::CryptoProvider::get_default().is_none());
        let client = redis::Client::open("rediss://127.0.0.1:1").unwrap();
        for builder in [
            RedisBackend::builder("rediss://127.0.0.1:1"),
            RedisBackend::from_client(client.clone()),
            RedisBackend::from_connection_info(client.get_connection_info().clone()),
        ] {
            let err = builder.build().await.unwrap_err();
            assert_eq!(err.kind(), BackendErrorKind::Config, "{err}");
            assert_eq!(err.config(), Some(&ConfigError::NoTlsProvider), "{err}");
            assert!(err.to_string().contains("install_default"), "{err}");
        }
        // Without TLS no provider is needed: nothing listens on port 1.
        let err = RedisBackend::builder("redis://127.0.0.1:1")
            .build()
            .await
            .unwrap_err();
        assert_eq!(err.kind(), BackendErrorKind::Unavailable, "{err}");
    }
}
