//! [`LockLayerBuilder`]: the configuration of a [`LockLayer`] (or a
//! [`RequestLocker`]), checked when it is built.

use std::{fmt, sync::Arc, time::Duration};

use bytes::Bytes;

use crate::{
    config_error::ConfigError,
    engine::{LockEngine, LockKey, LockOptions},
    integration::{Config, RejectHook, RequestLocker},
    key::{self, KeyExtractor},
    layer::LockLayer,
    options::{BackendFailurePolicy, MissingKeyPolicy, ReleasePoint},
    reject::{Rejection, RejectionKind},
};

/// A [`LockLayer`] (or [`RequestLocker`]) under construction: setters consume and return the
/// builder; [`build`](Self::build) checks the configuration.
#[must_use]
pub struct LockLayerBuilder {
    engine: LockEngine,
    extractor: Option<Arc<dyn KeyExtractor>>,
    namespace: String,
    missing: MissingKeyPolicy,
    /// `ttl`, `wait`, `fifo` and `max_waiters`, as the engine takes them.
    options: LockOptions,
    /// A `ttl` under [`MIN_TTL`], kept so that `build` refuses it (the engine's options
    /// would round it up to `MIN_TTL`).
    short_ttl: Option<Duration>,
    busy: RejectionKind,
    backend_failure: BackendFailurePolicy,
    release: ReleasePoint,
    retry_after_fallback: Duration,
    on_reject: Option<RejectHook>,
    /// The methods that take a lock (`None`: every method).
    methods: Option<Vec<http::Method>>,
    problem_type_base: Option<String>,
    /// The `layer` label of the metrics (`None`: the namespace, else the extractor's kind).
    metrics_name: Option<String>,
    /// Built for idempotency replay: a duplicate waits for the replay, so `409` and a
    /// wait go together.
    replaying: bool,
}

impl fmt::Debug for LockLayerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockLayerBuilder")
            .field("namespace", &self.namespace)
            .field("missing", &self.missing)
            .field("ttl", &self.short_ttl.unwrap_or(self.options.lease_ttl()))
            .field("wait", &self.wait_limit())
            .field("fifo", &self.options.is_fifo())
            .field("max_waiters", &self.options.waiter_limit())
            .field("backend_failure", &self.backend_failure)
            .field("release", &self.release)
            .finish_non_exhaustive()
    }
}

impl LockLayerBuilder {
    pub(crate) fn new(engine: LockEngine) -> Self {
        LockLayerBuilder {
            engine,
            extractor: None,
            namespace: String::new(),
            missing: MissingKeyPolicy::default(),
            // The engine's defaults (a 30 s TTL, no FIFO, no waiter limit) but one: a layer
            // does not wait for a held key unless told to.
            options: LockOptions::new().wait(Duration::ZERO),
            short_ttl: None,
            busy: RejectionKind::Locked,
            backend_failure: BackendFailurePolicy::default(),
            release: ReleasePoint::default(),
            retry_after_fallback: Duration::from_secs(1),
            on_reject: None,
            methods: None,
            problem_type_base: None,
            metrics_name: None,
            replaying: false,
        }
    }

    /// The base of the problem `type` URIs of rejections, so they point at your own
    /// documentation: `https://example.com/problems/` makes a `423` answer with
    /// `"type": "https://example.com/problems/locked"` (the base followed by
    /// [`RejectionKind::slug`]). Default: the `urn:tower-lock:problem:` URNs. A base that is
    /// not a valid URI is refused by [`build`](Self::build). Every rejection also carries
    /// `instance`, the request path (RFC 9457).
    pub fn problem_type_base(mut self, base: impl Into<String>) -> Self {
        self.problem_type_base = Some(base.into());
        self
    }

    /// The layer's name in its metrics (the `layer` label of every series recorded through
    /// the `metrics` facade, see [`metrics`](crate::metrics)) and in its outage logs.
    /// Default: the [`namespace`](Self::namespace), or the extractor's
    /// [kind](KeyExtractor::kind) when the namespace is empty (`idempotency-key` for the
    /// idempotency preset).
    pub fn metrics_name(mut self, name: impl Into<String>) -> Self {
        self.metrics_name = Some(name.into());
        self
    }

    /// Lock only requests with one of these methods; the others pass through unlocked
    /// (no key is extracted, so a keyless `GET` next to a keyed `POST` on one route is not
    /// answered `400`). Default: every method; the idempotency preset: `POST` and `PATCH`.
    /// An empty list is refused by [`build`](Self::build).
    ///
    /// ```
    /// use http::Method;
    /// use tower_lock::{LockEngine, LockLayer, key::PathKey};
    ///
    /// let layer = LockLayer::builder(LockEngine::in_memory())
    ///     .key(PathKey)
    ///     .methods([Method::POST, Method::PUT, Method::DELETE])
    ///     .build()
    ///     .unwrap();
    /// # let _ = layer;
    /// ```
    pub fn methods(mut self, methods: impl IntoIterator<Item = http::Method>) -> Self {
        self.methods = Some(methods.into_iter().collect());
        self
    }

    /// How a held key is answered when not waiting: `Locked` (423), or `Conflict` (409)
    /// under the idempotency preset.
    pub(crate) fn busy(mut self, kind: RejectionKind) -> Self {
        self.busy = kind;
        self
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
    /// node blocks the key, not how long a request may take. At least 1 ms and at most a
    /// day, or [`build`](Self::build) fails. Default: 30 s.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.short_ttl = (ttl < MIN_TTL).then_some(ttl);
        self.options = self.options.ttl(ttl);
        self
    }

    /// How long a request waits for a held key. `Duration::ZERO` (the default) answers
    /// `423 Locked` at once; otherwise a wait that runs out is answered
    /// `429 Too Many Requests`.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.options = self.options.wait(wait);
        self
    }

    /// Grant waiting requests the key in arrival order. Needs a wait limit. Default: off.
    pub fn fifo(mut self, fifo: bool) -> Self {
        self.options = self.options.fifo(fifo);
        self
    }

    /// At most `max` requests wait per key; more are answered `429` at once. Needs a wait
    /// limit, and at least 1 (with no room to wait, set no wait limit instead: a held key
    /// is then answered `423` at once). Default: no limit.
    pub fn max_waiters(mut self, max: usize) -> Self {
        self.options = self.options.max_waiters(max);
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

    /// The key extractor, already shared (the idempotency builder composes its own).
    pub(crate) fn key_shared(mut self, extractor: Arc<dyn KeyExtractor>) -> Self {
        self.extractor = Some(extractor);
        self
    }

    pub(crate) fn backend_failure_policy(&self) -> BackendFailurePolicy {
        self.backend_failure
    }

    pub(crate) fn replaying(mut self) -> Self {
        self.replaying = true;
        self
    }

    pub(crate) fn engine(&self) -> &LockEngine {
        &self.engine
    }

    /// The wait limit. Never unset: the builder starts from a zero wait and has no setter
    /// for an unlimited one.
    fn wait_limit(&self) -> Duration {
        self.options.wait_limit().unwrap_or(Duration::MAX)
    }

    /// Check the configuration and build the layer.
    pub fn build(self) -> Result<LockLayer, ConfigError> {
        self.build_locker().map(LockLayer::from)
    }

    /// Check the configuration and build the framework-neutral runtime core (for framework
    /// integrations).
    pub fn build_locker(self) -> Result<RequestLocker, ConfigError> {
        let wait = self.wait_limit();
        let extractor = self.extractor.ok_or(ConfigError::NoKeyExtractor)?;
        extractor.validate().map_err(ConfigError::Extractor)?;
        let options = self.options;
        match self.short_ttl {
            Some(ttl) if ttl.is_zero() => return Err(ConfigError::ZeroTtl),
            Some(ttl) => return Err(ConfigError::TtlTooShort(ttl)),
            None => {}
        }
        if options.lease_ttl() > MAX_DURATION {
            return Err(ConfigError::TooLong("ttl"));
        }
        if wait > MAX_DURATION {
            return Err(ConfigError::TooLong("wait"));
        }
        if wait.is_zero() && options.is_fifo() {
            return Err(ConfigError::NeedsWait("fifo"));
        }
        if options.waiter_limit() == Some(0) {
            return Err(ConfigError::ZeroMaxWaiters);
        }
        let problem_type_base = match self.problem_type_base {
            Some(base) if base.is_empty() || base.parse::<http::Uri>().is_err() => {
                return Err(ConfigError::ProblemTypeBase(base));
            }
            base => base.map(Arc::from),
        };
        let methods = match self.methods {
            Some(methods) if methods.is_empty() => return Err(ConfigError::NoMethods),
            Some(methods) => Some(methods.iter().map(|m| m.as_str().into()).collect()),
            None => None,
        };
        if wait.is_zero() && options.waiter_limit().is_some() {
            return Err(ConfigError::NeedsWait("max_waiters"));
        }
        if !wait.is_zero() && self.busy == RejectionKind::Conflict && !self.replaying {
            return Err(ConfigError::IdempotencyWait);
        }
        if !self.namespace.is_empty() {
            // The namespace must itself be key material; a full key is checked per request.
            LockKey::new(&self.namespace).map_err(ConfigError::Namespace)?;
        }
        let key_head = key::key_head(&self.namespace, extractor.kind());
        let name = self.metrics_name.unwrap_or_else(|| {
            if self.namespace.is_empty() {
                extractor.kind().to_owned()
            } else {
                self.namespace.clone()
            }
        });
        LockKey::new(&key_head).map_err(ConfigError::Namespace)?;
        Ok(RequestLocker::new(
            Config {
                extractor,
                namespace: self.namespace,
                key_head,
                missing: self.missing,
                options,
                wait,
                busy: self.busy,
                backend_failure: self.backend_failure,
                release: self.release,
                retry_after_fallback: self.retry_after_fallback,
                on_reject: self.on_reject,
                methods,
                problem_type_base,
                name,
            },
            self.engine,
        ))
    }
}

/// The shortest `ttl` accepted: the engine's resolution ([`LockOptions::ttl`] rounds
/// anything shorter up to it).
const MIN_TTL: Duration = Duration::from_millis(1);

/// The longest `ttl` or `wait` accepted: a day. Longer is a mistake for an HTTP request
/// (and `Duration::MAX` would overflow the clock).
const MAX_DURATION: Duration = Duration::from_secs(24 * 60 * 60);
