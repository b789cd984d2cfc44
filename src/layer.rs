//! [`LockLayer`] and its builder.
//!
//! ```
//! use std::time::Duration;
//! use http::HeaderName;
//! use tower_lock::{LockEngine, LockLayer, key::HeaderKey};
//!
//! # fn main() -> Result<(), tower_lock::ConfigError> {
//! let layer = LockLayer::builder(LockEngine::in_memory())
//!     .key(HeaderKey::new(HeaderName::from_static("x-tenant-id")))
//!     .wait(Duration::from_secs(5)) // queue up to 5 s, then 429
//!     .fifo(true)                   // in arrival order
//!     .max_waiters(32)              // more than 32 waiting: 429 at once
//!     .build()?;
//! # let _ = layer;
//! # Ok(())
//! # }
//! ```

use std::{error::Error as StdError, fmt, sync::Arc, time::Duration};

use bytes::Bytes;
use tower_layer::Layer;

use crate::{
    engine::{LockEngine, LockKey},
    error::KeyError,
    integration::{Config, RejectHook, RequestLocker},
    key::{self, IdempotencyKey, KeyExtractor},
    metrics::LockMetrics,
    options::{BackendFailurePolicy, MissingKeyPolicy, ReleasePoint},
    reject::{Rejection, RejectionKind},
    service::LockService,
};

/// Serializes the wrapped service per lock key; see the [crate docs](crate).
///
/// The layer holds an `Arc` of its configuration and shared state (a
/// [`RequestLocker`]), created by
/// [`LockLayerBuilder::build`]: every service it wraps (for example every route of a
/// router) locks on the same table and reports to the same metrics.
#[derive(Clone, Debug)]
pub struct LockLayer {
    locker: RequestLocker,
}

impl LockLayer {
    /// A builder locking on `engine`. Set a key extractor with
    /// [`LockLayerBuilder::key`], then [`build`](LockLayerBuilder::build).
    pub fn builder(engine: LockEngine) -> LockLayerBuilder {
        LockLayerBuilder::new(engine)
    }

    /// The idempotency preset, after the IETF Idempotency-Key draft: the key is the
    /// `Idempotency-Key` header (required: `400` when missing or malformed), and a
    /// duplicate in flight is answered `409 Conflict` at once. Scope keys by tenant or
    /// principal with
    /// `.key(ScopedKey::new(header, IdempotencyKey::new()))`.
    ///
    /// ```
    /// use http::HeaderName;
    /// use tower_lock::{LockEngine, LockLayer, key::{IdempotencyKey, ScopedKey}};
    ///
    /// let layer = LockLayer::idempotency(LockEngine::in_memory())
    ///     .key(ScopedKey::new(HeaderName::from_static("x-tenant-id"), IdempotencyKey::new()))
    ///     .build()
    ///     .unwrap();
    /// # let _ = layer;
    /// ```
    pub fn idempotency(engine: LockEngine) -> LockLayerBuilder {
        let mut b = LockLayerBuilder::new(engine)
            .key(IdempotencyKey::new())
            .on_missing_key(MissingKeyPolicy::Reject);
        b.busy = RejectionKind::Conflict;
        b
    }

    /// The layer's counters and histograms.
    pub fn metrics(&self) -> LockMetrics {
        self.locker.metrics()
    }

    /// The framework-neutral runtime core behind the layer: hand it to a framework
    /// integration to lock on the same table, or ask it for a lock key
    /// ([`RequestLocker::lock_key`]).
    pub fn locker(&self) -> &RequestLocker {
        &self.locker
    }
}

impl From<RequestLocker> for LockLayer {
    fn from(locker: RequestLocker) -> Self {
        LockLayer { locker }
    }
}

impl<S> Layer<S> for LockLayer {
    type Service = LockService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        // Clone the locker handle, never create state here: one layer on many services
        // must exclude across all of them.
        LockService::new(inner, self.locker.clone())
    }
}

/// A [`LockLayer`] (or [`RequestLocker`]) under construction: setters consume and return the
/// builder; [`build`](Self::build) checks the configuration.
#[must_use]
pub struct LockLayerBuilder {
    engine: LockEngine,
    extractor: Option<Arc<dyn KeyExtractor>>,
    namespace: String,
    missing: MissingKeyPolicy,
    ttl: Duration,
    wait: Duration,
    fifo: bool,
    max_waiters: Option<usize>,
    busy: RejectionKind,
    backend_failure: BackendFailurePolicy,
    release: ReleasePoint,
    retry_after_fallback: Duration,
    on_reject: Option<RejectHook>,
}

impl fmt::Debug for LockLayerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockLayerBuilder")
            .field("namespace", &self.namespace)
            .field("missing", &self.missing)
            .field("ttl", &self.ttl)
            .field("wait", &self.wait)
            .field("fifo", &self.fifo)
            .field("max_waiters", &self.max_waiters)
            .field("backend_failure", &self.backend_failure)
            .field("release", &self.release)
            .finish_non_exhaustive()
    }
}

impl LockLayerBuilder {
    fn new(engine: LockEngine) -> Self {
        LockLayerBuilder {
            engine,
            extractor: None,
            namespace: String::new(),
            missing: MissingKeyPolicy::default(),
            ttl: Duration::from_secs(30),
            wait: Duration::ZERO,
            fifo: false,
            max_waiters: None,
            busy: RejectionKind::Locked,
            backend_failure: BackendFailurePolicy::default(),
            release: ReleasePoint::default(),
            retry_after_fallback: Duration::from_secs(1),
            on_reject: None,
        }
    }

    /// How to derive the lock key of a request (required). See [`crate::key`].
    pub fn key(mut self, extractor: impl KeyExtractor) -> Self {
        self.extractor = Some(Arc::new(extractor));
        self
    }

    /// The layer's namespace: the first part of each of its lock keys
    /// (`<namespace>/<kind>/<value>`, see [`key`](crate::key#the-lock-key)). Layers on one
    /// engine with different namespaces never share a lock, whatever their clients send;
    /// layers with the same namespace and extractors of the same kind share their locks
    /// (one tenant lock over several routes, say). Give each layer keyed by a closure a
    /// namespace of its own. Any text without control characters. Default: empty.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// The former name of [`namespace`](Self::namespace), which it now sets. The lock key
    /// is no longer the prefix's text glued to the extracted value: a prefix of
    /// `"tenant:"` names keys such as `tenant:/header=x-tenant-id/acme`.
    #[deprecated(
        since = "0.1.0",
        note = "use `namespace`: the prefix is now one part of an injective key encoding"
    )]
    pub fn key_prefix(self, prefix: impl Into<String>) -> Self {
        self.namespace(prefix)
    }

    /// What to do with a request without a key. Default: [`MissingKeyPolicy::Reject`].
    pub fn on_missing_key(mut self, policy: MissingKeyPolicy) -> Self {
        self.missing = policy;
        self
    }

    /// The lease length; renewed while the request runs, so it bounds how long a crashed
    /// node blocks the key, not how long a request may take. Default: 30 s.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// How long a request waits for a held key. `Duration::ZERO` (the default) answers
    /// `423 Locked` at once; otherwise a wait that runs out is answered
    /// `429 Too Many Requests`.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// Grant waiting requests the key in arrival order. Needs a wait limit. Default: off.
    pub fn fifo(mut self, fifo: bool) -> Self {
        self.fifo = fifo;
        self
    }

    /// At most `max` requests wait per key; more are answered `429` at once. Needs a wait
    /// limit. Default: no limit.
    pub fn max_waiters(mut self, max: usize) -> Self {
        self.max_waiters = Some(max);
        self
    }

    /// What to do when the backend fails. Default: [`BackendFailurePolicy::FailClosed`].
    pub fn on_backend_failure(mut self, policy: BackendFailurePolicy) -> Self {
        self.backend_failure = policy;
        self
    }

    /// When to release the lease. Default: [`ReleasePoint::BodyEnd`]. `101 Switching
    /// Protocols` responses always release when the response is returned.
    pub fn release_at(mut self, point: ReleasePoint) -> Self {
        self.release = point;
        self
    }

    /// The `Retry-After` sent when the backend gives no hint (a `503`, or contention with
    /// an unknown holder TTL). Rounded up to whole seconds, at least 1. Default: 1 s.
    pub fn retry_after_fallback(mut self, d: Duration) -> Self {
        self.retry_after_fallback = d;
        self
    }

    /// Build rejection responses with `hook` instead of the default problem+json.
    pub fn on_reject<F>(mut self, hook: F) -> Self
    where
        F: Fn(Rejection) -> http::Response<Bytes> + Send + Sync + 'static,
    {
        self.on_reject = Some(Arc::new(hook));
        self
    }

    /// Check the configuration and build the layer.
    pub fn build(self) -> Result<LockLayer, ConfigError> {
        self.build_locker().map(LockLayer::from)
    }

    /// Check the configuration and build the framework-neutral runtime core (for framework
    /// integrations).
    pub fn build_locker(self) -> Result<RequestLocker, ConfigError> {
        let extractor = self.extractor.ok_or(ConfigError::NoKeyExtractor)?;
        if self.ttl.is_zero() {
            return Err(ConfigError::ZeroTtl);
        }
        if self.ttl > MAX_DURATION {
            return Err(ConfigError::TooLong("ttl"));
        }
        if self.wait > MAX_DURATION {
            return Err(ConfigError::TooLong("wait"));
        }
        if self.wait.is_zero() && self.fifo {
            return Err(ConfigError::NeedsWait("fifo"));
        }
        if self.wait.is_zero() && self.max_waiters.is_some() {
            return Err(ConfigError::NeedsWait("max_waiters"));
        }
        if !self.wait.is_zero() && self.busy == RejectionKind::Conflict {
            return Err(ConfigError::IdempotencyWait);
        }
        if !self.namespace.is_empty() {
            // The namespace must itself be key material; a full key is checked per request.
            LockKey::new(&self.namespace).map_err(ConfigError::Namespace)?;
        }
        let key_head = key::key_head(&self.namespace, extractor.kind());
        LockKey::new(&key_head).map_err(ConfigError::Namespace)?;
        Ok(RequestLocker::new(
            Config {
                extractor,
                namespace: self.namespace,
                key_head,
                missing: self.missing,
                ttl: self.ttl,
                wait: self.wait,
                fifo: self.fifo,
                max_waiters: self.max_waiters,
                busy: self.busy,
                backend_failure: self.backend_failure,
                release: self.release,
                retry_after_fallback: self.retry_after_fallback,
                on_reject: self.on_reject,
            },
            self.engine,
        ))
    }
}

/// The longest `ttl` or `wait` accepted: a day. Longer is a mistake for an HTTP request
/// (and `Duration::MAX` would overflow the clock).
pub(crate) const MAX_DURATION: Duration = Duration::from_secs(24 * 60 * 60);

/// A [`LockLayerBuilder`] configuration that cannot work.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// No key extractor was set.
    NoKeyExtractor,
    /// The lease TTL is zero.
    ZeroTtl,
    /// The named option only applies to waiting requests, and the wait limit is zero.
    NeedsWait(&'static str),
    /// The named duration (`ttl` or `wait`) is longer than a day.
    TooLong(&'static str),
    /// The idempotency preset answers a duplicate in flight with `409` at once; waiting
    /// would run the duplicate after the first instead.
    IdempotencyWait,
    /// The namespace (or, with it, the extractor's kind) is not valid key material: a
    /// control character, or too long to leave room for a value.
    Namespace(KeyError),
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::NoKeyExtractor => f.write_str("no key extractor: call .key(..)"),
            ConfigError::ZeroTtl => f.write_str("the lease TTL must be greater than zero"),
            ConfigError::NeedsWait(option) => {
                write!(f, "`{option}` needs a wait limit greater than zero")
            }
            ConfigError::TooLong(option) => {
                write!(f, "`{option}` is longer than a day")
            }
            ConfigError::IdempotencyWait => f.write_str(
                "the idempotency preset answers duplicates with 409 at once; it cannot wait",
            ),
            ConfigError::Namespace(e) => write!(f, "invalid key namespace: {e}"),
        }
    }
}

impl StdError for ConfigError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        match self {
            ConfigError::Namespace(e) => Some(e),
            _ => None,
        }
    }
}
