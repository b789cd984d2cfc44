//! Typed errors of the lock engine.

use std::{error::Error as StdError, fmt, time::Duration};

use crate::ConfigError;

/// Why a lock operation did not succeed.
///
/// The variants tell apart the cases a caller reacts to differently: the key is busy (try
/// again later, `retry_after` says when the current lease would run out), the wait limit
/// passed, the wait queue is full, the lease is not (or no longer) ours, the input was
/// malformed, or the backend failed.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum LockError {
    /// A non-blocking acquire found the key held.
    Busy {
        /// The holder's remaining TTL, when the backend knows it.
        retry_after: Option<Duration>,
    },
    /// A blocking acquire waited for its whole wait limit without getting the key.
    TimedOut {
        /// How long the caller waited.
        waited: Duration,
        /// The holder's remaining TTL when the wait ended, when known.
        retry_after: Option<Duration>,
    },
    /// The key already has the configured maximum number of waiters.
    QueueFull {
        /// The holder's remaining TTL, when known.
        retry_after: Option<Duration>,
    },
    /// The key is held under another token: the operation was refused and nothing changed.
    NotOwned,
    /// Nobody holds the key any more: our lease had already expired or been released.
    Expired,
    /// The key or token is malformed.
    InvalidKey(KeyError),
    /// An argument is out of range (for example a non-finite number).
    InvalidValue(&'static str),
    /// The backend failed (connection lost, timeout, protocol error).
    Backend(BackendError),
    /// The backend lacks the optional capability the operation needs (admin operations,
    /// numeric compare-and-set, lock pools); nothing was done.
    Unsupported(&'static str),
}

impl LockError {
    /// The holder's remaining TTL carried by contention errors, if any.
    #[must_use]
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Busy { retry_after }
            | Self::TimedOut { retry_after, .. }
            | Self::QueueFull { retry_after } => *retry_after,
            _ => None,
        }
    }

    /// Why the backend's configuration or server was refused, when that is what failed
    /// (a [`BackendErrorKind::Config`] error with a typed cause).
    #[must_use]
    pub fn config(&self) -> Option<&ConfigError> {
        match self {
            Self::Backend(e) => e.config(),
            _ => None,
        }
    }

    /// `true` for the errors that mean "someone else holds the key": busy, timed out, queue full.
    #[must_use]
    pub fn is_contention(&self) -> bool {
        matches!(
            self,
            Self::Busy { .. } | Self::TimedOut { .. } | Self::QueueFull { .. }
        )
    }
}

impl fmt::Display for LockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Busy { .. } => f.write_str("lock is held by another owner"),
            Self::TimedOut { waited, .. } => {
                write!(f, "timed out after waiting {waited:?} for the lock")
            }
            Self::QueueFull { .. } => f.write_str("too many waiters for this lock"),
            Self::NotOwned => f.write_str("lock is held by another owner; not applied"),
            Self::Expired => f.write_str("lease had already expired; not applied"),
            Self::InvalidKey(e) => write!(f, "invalid lock key: {e}"),
            Self::InvalidValue(why) => write!(f, "invalid value: {why}"),
            Self::Backend(e) => write!(f, "lock backend failed: {e}"),
            Self::Unsupported(what) => write!(f, "the backend does not support {what}"),
        }
    }
}

impl StdError for LockError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        match self {
            Self::InvalidKey(e) => Some(e),
            Self::Backend(e) => Some(e),
            _ => None,
        }
    }
}

impl From<KeyError> for LockError {
    fn from(e: KeyError) -> Self {
        Self::InvalidKey(e)
    }
}

impl From<BackendError> for LockError {
    fn from(e: BackendError) -> Self {
        Self::Backend(e)
    }
}

impl From<ConfigError> for LockError {
    fn from(e: ConfigError) -> Self {
        Self::Backend(e.into())
    }
}

/// A lock key or token that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyError {
    /// The key (or token) is empty.
    Empty,
    /// The key (or token) is longer than the limit, in bytes.
    TooLong {
        /// The length that was given.
        len: usize,
        /// The largest length accepted.
        max: usize,
    },
    /// The key contains a control character.
    ControlCharacter,
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Empty => f.write_str("key is empty"),
            Self::TooLong { len, max } => {
                write!(f, "key is {len} bytes long, more than the limit of {max}")
            }
            Self::ControlCharacter => f.write_str("key contains a control character"),
        }
    }
}

impl StdError for KeyError {}

/// A failure of the backend itself: it could not be reached, did not answer in time, or
/// answered something unexpected. The operation's outcome is unknown to the caller.
#[derive(Debug, Clone)]
pub struct BackendError {
    kind: BackendErrorKind,
    /// The server answered that it cannot serve the call now (see [`Self::is_refusal`]).
    refusal: bool,
    /// The refusal of a server busy running a script: it serves nobody else meanwhile and
    /// keeps every key as it was (see [`Self::is_busy`]).
    busy: bool,
    message: String,
    /// The typed cause of a [`BackendErrorKind::Config`] error, when there is one.
    config: Option<Box<ConfigError>>,
    source: Option<std::sync::Arc<dyn StdError + Send + Sync>>,
}

/// What kind of backend failure happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum BackendErrorKind {
    /// The backend did not answer within its timeout.
    Timeout,
    /// The backend could not be reached, or the connection broke.
    Unavailable,
    /// The backend answered something the engine does not understand.
    Protocol,
    /// The backend was configured wrongly (a bad URL, prefix or limit, a setting out of
    /// range), or the server it was given is not fit to keep locks (a Redis
    /// `maxmemory-policy` that may evict keys, a user without rights on the engine's
    /// wake-up channels); found at build time, and the message says why.
    /// [`BackendError::config`] gives the refusal as a [`ConfigError`] to match on.
    Config,
    /// Fewer replicas than required acknowledged the write within their time (the Redis
    /// backend's `replica_ack`); the write was undone: an acquire that failed so holds
    /// nothing.
    NotReplicated,
}

impl BackendError {
    /// A new backend error of `kind` with a message.
    pub fn new(kind: BackendErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            refusal: false,
            busy: false,
            message: message.into(),
            config: None,
            source: None,
        }
    }

    /// Mark this failure as a [refusal](Self::is_refusal).
    #[must_use]
    pub fn refused(mut self) -> Self {
        self.refusal = true;
        self
    }

    /// `true` when the server answered that it cannot serve the call for now, and so did
    /// not run it: a Redis busy running a script (`BUSY`), loading its data (`LOADING`), a
    /// replica (`READONLY`, `MASTERDOWN`), a cluster slot moving or down (`TRYAGAIN`,
    /// `CLUSTERDOWN`). Unlike a broken connection or a timeout, nothing is in doubt: the
    /// same call may be sent again, and usually succeeds within moments. Such a failure is
    /// of kind [`Unavailable`](BackendErrorKind::Unavailable).
    #[must_use]
    pub fn is_refusal(&self) -> bool {
        self.refusal
    }

    /// Mark this failure as the [refusal](Self::is_refusal) of a server that serves nobody
    /// while it lasts and keeps every lease as it was (see [`Self::is_busy`]).
    #[must_use]
    pub fn busy(mut self) -> Self {
        self.refusal = true;
        self.busy = true;
        self
    }

    /// A refusal that leaves every lease as it was on the server, for no one can be
    /// granted anything while it lasts (a Redis busy running a script): a renewal refused
    /// so is tried again within the lease's confirmed validity, not taken for a lost
    /// lease. Any other failed renewal loses its leases at once.
    #[must_use]
    pub fn is_busy(&self) -> bool {
        self.busy
    }

    /// Attach the underlying error.
    #[must_use]
    pub fn with_source(mut self, source: impl StdError + Send + Sync + 'static) -> Self {
        self.source = Some(std::sync::Arc::new(source));
        self
    }

    /// The underlying error, shared (to carry it over into another error).
    #[cfg(feature = "redis")]
    pub(crate) fn source_error(&self) -> Option<std::sync::Arc<dyn StdError + Send + Sync>> {
        self.source.clone()
    }

    /// This error with `source` (shared) as its underlying error.
    #[cfg(feature = "redis")]
    pub(crate) fn with_shared_source(
        mut self,
        source: std::sync::Arc<dyn StdError + Send + Sync>,
    ) -> Self {
        self.source = Some(source);
        self
    }

    /// What kind of failure this is.
    #[must_use]
    pub fn kind(&self) -> BackendErrorKind {
        self.kind
    }

    /// Why the configuration or the server was refused, for a
    /// [`Config`](BackendErrorKind::Config) error made from a [`ConfigError`]: the
    /// refusal to match on, where the text is for people.
    #[must_use]
    pub fn config(&self) -> Option<&ConfigError> {
        self.config.as_deref()
    }
}

/// A [`Config`](BackendErrorKind::Config) error whose text is the refusal's.
impl From<ConfigError> for BackendError {
    fn from(e: ConfigError) -> Self {
        let mut error = Self::new(BackendErrorKind::Config, e.to_string());
        error.config = Some(Box::new(e));
        error
    }
}

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            BackendErrorKind::Timeout => "timeout",
            BackendErrorKind::Unavailable => "unavailable",
            BackendErrorKind::Protocol => "protocol error",
            BackendErrorKind::Config => "configuration error",
            BackendErrorKind::NotReplicated => "not replicated",
        };
        write!(f, "{kind}: {}", self.message)?;
        if let Some(source) = &self.source {
            write!(f, ": {source}")?;
        }
        Ok(())
    }
}

impl StdError for BackendError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn StdError + 'static))
    }
}
