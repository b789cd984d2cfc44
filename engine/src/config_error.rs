//! [`ConfigError`]: why a backend builder refused to build.

use std::{error::Error as StdError, fmt, time::Duration};

/// A backend configuration that cannot work, or a server unfit to keep locks: refused when
/// the backend is built (or, for a backend built before its server answered, on the first
/// call that reaches it).
///
/// It travels as the typed cause of a [`BackendError`](crate::BackendError) of kind
/// [`Config`](crate::BackendErrorKind::Config) (see
/// [`BackendError::config`](crate::BackendError::config) and
/// [`LockError::config`](crate::LockError::config)), whose text is this error's. Every
/// variant today is a refusal of the Redis backend's builder. (Not to be confused with
/// `tower_lock::ConfigError`, a layer builder's refusal.)
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// The key prefix is empty, longer than `max` bytes, or has a brace or a control
    /// character.
    Prefix {
        /// The prefix as given.
        prefix: String,
        /// The longest prefix accepted, in bytes.
        max: usize,
    },
    /// The connection pool size is zero.
    PoolSize,
    /// The command timeout is zero or longer than `max`.
    CommandTimeout {
        /// The timeout as given.
        timeout: Duration,
        /// The longest timeout accepted.
        max: Duration,
    },
    /// `replica_ack` was given no replica, or a timeout that is zero or longer than `max`.
    ReplicaAck {
        /// The longest timeout accepted.
        max: Duration,
    },
    /// The server's URL or connection settings cannot be used (the cause is the
    /// [`BackendError`](crate::BackendError)'s source).
    InvalidUrl,
    /// The Sentinels' URLs cannot be used, or none was given.
    SentinelUrls,
    /// The cluster nodes' URLs cannot be used, or none was given.
    ClusterUrls,
    /// A TLS address while no rustls crypto provider is installed for the process.
    NoTlsProvider,
    /// The server runs with a `maxmemory-policy` that may evict keys (the policy named).
    EvictingPolicy(String),
    /// The server refused both ways of reading its `maxmemory-policy` (`CONFIG GET` and
    /// `INFO memory`).
    EvictionPolicyUnreadable,
    /// The server reported no `maxmemory-policy`.
    EvictionPolicyUnreported,
    /// The connected user may not subscribe to, or publish on, the engine's wake-up
    /// channels.
    ChannelRights {
        /// The user, when the server said who it is.
        user: Option<String>,
        /// The command refused (`SUBSCRIBE`, `PUBLISH`, `SSUBSCRIBE`, `SPUBLISH`).
        command: &'static str,
        /// The server's reason.
        reason: String,
        /// The engine's key prefix, whose channels (`<prefix>:*`) the user needs.
        prefix: String,
    },
    /// Nodes of an earlier Redis key layout (locks and shared leases apart) are running on
    /// the prefix: the two layouts must not share one (see the Redis backend's docs on
    /// rolling upgrades).
    EarlierLayout {
        /// The engine's key prefix.
        prefix: String,
        /// How many such nodes watch the server.
        nodes: u64,
    },
}

/// The text tells what to do about it: these errors reach an operator reading a log.
impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let no_eviction = "the lock server must not evict keys: make sure it runs with \
                           noeviction, then opt in with allow_evicting_policy(true)";
        match self {
            Self::Prefix { prefix, max } => write!(
                f,
                "redis key prefix {prefix:?} must be 1 to {max} bytes without braces or control characters"
            ),
            Self::PoolSize => f.write_str("redis pool size must be at least 1"),
            Self::CommandTimeout { timeout, max } => write!(
                f,
                "redis command timeout must be positive and at most {max:?}, not {timeout:?}"
            ),
            Self::ReplicaAck { max } => write!(
                f,
                "replica_ack needs at least 1 replica and a positive timeout of at most {max:?}"
            ),
            Self::InvalidUrl => f.write_str("invalid redis URL or connection settings"),
            Self::SentinelUrls => f.write_str("invalid redis sentinel URLs"),
            Self::ClusterUrls => f.write_str("invalid redis cluster node URLs"),
            Self::NoTlsProvider => f.write_str(
                "TLS to Redis needs a rustls crypto provider installed for the process, and none is: \
                 install the one your application uses once at startup, before building the backend, \
                 e.g. `rustls::crypto::aws_lc_rs::default_provider().install_default()` (rustls's \
                 `aws-lc-rs` feature) or `rustls::crypto::ring::default_provider().install_default()` \
                 (its `ring` feature); the `redis-tls` feature enables none of its own",
            ),
            Self::EvictingPolicy(policy) => write!(
                f,
                "the redis server runs with maxmemory-policy {policy}, which may evict held \
                 locks (every engine key has a TTL) and hand them to a second holder; use \
                 noeviction on the lock server, or opt in with allow_evicting_policy(true)"
            ),
            Self::EvictionPolicyUnreadable => write!(
                f,
                "cannot read the redis server's maxmemory-policy (CONFIG GET and INFO \
                 memory are both refused); {no_eviction}"
            ),
            Self::EvictionPolicyUnreported => write!(
                f,
                "the redis server reported no maxmemory-policy; {no_eviction}"
            ),
            Self::ChannelRights {
                user,
                command,
                reason,
                prefix,
            } => {
                match user {
                    Some(user) => write!(f, "the redis user `{user}`")?,
                    None => f.write_str("the redis user")?,
                }
                write!(
                    f,
                    " may not {command} on the lock engine's wake-up channels ({reason}), so \
                     grants could not wake waiters: grant it `&{prefix}:*` (and +{})",
                    command.to_ascii_lowercase()
                )
            }
            Self::EarlierLayout { prefix, nodes } => write!(
                f,
                "{nodes} node(s) of an earlier tower-lock version run on redis prefix {prefix:?} \
                 with another key layout (locks and shared leases apart), which this version \
                 does not share a prefix with: stop them first, or give this version a new prefix"
            ),
        }
    }
}

impl StdError for ConfigError {}
