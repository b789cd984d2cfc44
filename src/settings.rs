//! [`LockSettings`]: the lock settings both middlewares are built with, checked in one
//! place, and the one rule for which of them each builder exposes.
//!
//! A [`LockLayerBuilder`](crate::LockLayerBuilder) and an
//! [`IdempotencyLayerBuilder`](crate::IdempotencyLayerBuilder) lock the same way: each holds
//! a `LockSettings` and gets its setters from [`lock_setters!`], so the two offer every
//! shared setting under the same name, with the same documentation and the same checks.
//! Each builder adds only what is its own: the lock layer its key extractor and its
//! release point, the idempotency layer its key within a scope and what it stores.

use std::{sync::Arc, time::Duration};

use bytes::Bytes;

use crate::{
    config_error::ConfigError,
    engine::{LockEngine, LockKey, LockOptions},
    integration::{Config, LockedMethods, RejectHook, RequestLocker, Sharing},
    key::{self, KeyExtractor},
    options::{BackendFailurePolicy, MissingKeyPolicy, ReleasePoint},
    reject::{Rejection, RejectionKind},
};

/// The lock settings of a middleware under construction: what
/// [`lock_setters!`] sets and [`build_locker`](Self::build_locker) checks.
pub(crate) struct LockSettings {
    pub(crate) namespace: String,
    pub(crate) missing: MissingKeyPolicy,
    /// `ttl`, `wait`, `fifo` and `max_waiters`, as the engine takes them.
    pub(crate) options: LockOptions,
    /// A `ttl` under [`MIN_TTL`], kept so that the build refuses it (the engine's options
    /// would round it up to `MIN_TTL`).
    short_ttl: Option<Duration>,
    /// How a held key is answered when not waiting: `Locked` (423), or `Conflict` (409)
    /// under the idempotency preset.
    busy: RejectionKind,
    pub(crate) backend_failure: BackendFailurePolicy,
    pub(crate) release: ReleasePoint,
    retry_after_fallback: Duration,
    on_reject: Option<RejectHook>,
    /// The names of the methods that take a lock, as given (`None`: every method but the
    /// safe ones); checked by the build.
    methods: Option<Vec<String>>,
    problem_type_base: Option<String>,
    /// The `layer` label of the metrics (`None`: the namespace, else the extractor's kind).
    metrics_name: Option<String>,
    /// Built for idempotency replay: a duplicate waits for the replay, so `409` and a
    /// wait go together.
    replaying: bool,
    /// The first value a setter could not take (a header name that is not one): setters
    /// return the builder, so the build reports it.
    refused: Option<ConfigError>,
    /// `permits(n)`: up to `n` holders per key (`None`: one, the plain lock; or, with
    /// `shared_for`, no limit on the shared ones).
    pub(crate) permits: Option<u32>,
    /// `shared_for([..])`: the methods that share the key, as given; the other locked
    /// methods take it alone.
    pub(crate) shared_for: Option<Vec<String>>,
}

impl LockSettings {
    /// A lock layer's defaults: the engine's (a 30 s TTL, no FIFO, no waiter limit) but
    /// one: a layer does not wait for a held key unless told to.
    pub(crate) fn new() -> Self {
        Self {
            namespace: String::new(),
            missing: MissingKeyPolicy::default(),
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
            refused: None,
            permits: None,
            shared_for: None,
        }
    }

    /// The idempotency preset, after the IETF Idempotency-Key draft: the key is required,
    /// a duplicate in flight is answered `409`, and only `POST` and `PATCH` are covered.
    #[cfg_attr(not(feature = "idempotency"), allow(dead_code))]
    pub(crate) fn idempotency() -> Self {
        Self {
            missing: MissingKeyPolicy::Reject,
            busy: RejectionKind::Conflict,
            methods: Some(vec!["POST".to_owned(), "PATCH".to_owned()]),
            ..Self::new()
        }
    }

    /// Marks the settings as an idempotency layer's with replay, whose duplicates may wait.
    #[cfg_attr(not(feature = "idempotency"), allow(dead_code))]
    pub(crate) fn replaying(mut self) -> Self {
        self.replaying = true;
        self
    }

    /// Keep `error` for the build, unless an earlier setter's error is kept already (the
    /// first mistake is the one to report).
    #[cfg_attr(not(feature = "idempotency"), allow(dead_code))]
    pub(crate) fn refuse(&mut self, error: ConfigError) {
        self.refused.get_or_insert(error);
    }

    /// The error of a value a setter could not take, if any.
    pub(crate) fn check_values(&self) -> Result<(), ConfigError> {
        self.refused.clone().map_or(Ok(()), Err)
    }

    pub(crate) fn ttl(&mut self, ttl: Duration) {
        self.short_ttl = (ttl < MIN_TTL).then_some(ttl);
        self.options = std::mem::take(&mut self.options).ttl(ttl);
    }

    pub(crate) fn wait(&mut self, wait: Duration) {
        self.options = std::mem::take(&mut self.options).wait(wait);
    }

    pub(crate) fn fifo(&mut self, fifo: bool) {
        self.options = std::mem::take(&mut self.options).fifo(fifo);
    }

    pub(crate) fn max_waiters(&mut self, max: usize) {
        self.options = std::mem::take(&mut self.options).max_waiters(max);
    }

    pub(crate) fn methods<M: AsRef<str>>(&mut self, methods: impl IntoIterator<Item = M>) {
        let names = methods.into_iter().map(|m| m.as_ref().to_owned());
        self.methods = Some(names.collect());
    }

    pub(crate) fn shared_for<M: AsRef<str>>(&mut self, methods: impl IntoIterator<Item = M>) {
        let names = methods.into_iter().map(|m| m.as_ref().to_owned());
        self.shared_for = Some(names.collect());
    }

    pub(crate) fn problem_type_base(&mut self, base: String) {
        self.problem_type_base = Some(base);
    }

    pub(crate) fn metrics_name(&mut self, name: String) {
        self.metrics_name = Some(name);
    }

    pub(crate) fn retry_after_fallback(&mut self, d: Duration) {
        self.retry_after_fallback = d;
    }

    pub(crate) fn on_reject<F>(&mut self, hook: F)
    where
        F: Fn(Rejection) -> http::Response<Bytes> + Send + Sync + 'static,
    {
        self.on_reject = Some(Arc::new(hook));
    }

    /// The TTL as set (one under the engine's resolution included), for `Debug`.
    pub(crate) fn ttl_as_set(&self) -> Duration {
        self.short_ttl.unwrap_or(self.options.lease_ttl())
    }

    /// The wait limit. Never unset: the settings start from a zero wait and have no setter
    /// for an unlimited one.
    pub(crate) fn wait_limit(&self) -> Duration {
        self.options.wait_limit().unwrap_or(Duration::MAX)
    }

    /// Check the settings and build the framework-neutral runtime core that locks with
    /// them on `engine`, keyed by `extractor`.
    pub(crate) fn build_locker(
        self,
        engine: LockEngine,
        extractor: Option<Arc<dyn KeyExtractor>>,
    ) -> Result<RequestLocker, ConfigError> {
        self.check_values()?;
        let wait = self.wait_limit();
        let extractor = extractor.ok_or(ConfigError::NoKeyExtractor)?;
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
        let methods = LockedMethods::from_names(self.methods)?;
        if self.busy == RejectionKind::Conflict
            && (self.permits.is_some() || self.shared_for.is_some())
        {
            // Two requests with one idempotency key must never run at once.
            return Err(ConfigError::IdempotencyPermits);
        }
        let (methods, sharing) = Sharing::from_settings(methods, self.permits, self.shared_for)?;
        if sharing.is_some() && !engine.has_shared_mode() {
            return Err(ConfigError::PermitsUnsupported);
        }
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
                sharing,
                problem_type_base,
                name,
            },
            engine,
        ))
    }
}

/// The shortest `ttl` accepted: the engine's resolution ([`LockOptions::ttl`] rounds
/// anything shorter up to it).
const MIN_TTL: Duration = Duration::from_millis(1);

/// The longest `ttl` or `wait` accepted: a day. Longer is a mistake for an HTTP request
/// (and `Duration::MAX` would overflow the clock).
const MAX_DURATION: Duration = Duration::from_secs(24 * 60 * 60);

/// The setters of the lock settings, for a builder with a `settings: LockSettings` field:
/// written once, so that both middlewares' builders offer every shared lock setting by the
/// same name and document it the same way.
macro_rules! lock_setters {
    () => {
        /// The layer's namespace: the first part of each of its lock keys
        /// (`<namespace>/<kind>/<value>`, see [`key`](crate::key#the-lock-key)), and of its
        /// idempotency records. Layers on one engine with different namespaces never share
        /// a lock, whatever their clients send; layers with the same namespace and
        /// extractors of the same kind share their locks (one tenant lock over several
        /// routes, say). Give each layer keyed by a closure a namespace of its own. Any text
        /// without control characters. Default: empty.
        pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
            self.settings.namespace = namespace.into();
            self
        }

        /// Lock exactly the requests with one of these methods; the others pass through
        /// unlocked (no key is extracted, so a keyless `GET` next to a keyed `POST` on one
        /// route is not answered `400`).
        ///
        /// Default: every method but the safe ones of RFC 9110 (§9.2.1): `GET`, `HEAD`,
        /// `OPTIONS` and `TRACE` pass through unlocked, so a CORS preflight or a status
        /// read never waits behind a write nor meets a `423`; `POST`, `PUT`, `PATCH`,
        /// `DELETE` and extension methods are locked. Name `GET` here for reads that must
        /// not run beside a write. Under idempotency the default is `POST` and `PATCH`
        /// (the methods that are not idempotent by definition).
        ///
        /// Methods are named as text (`"POST"`) or by any type that is one (`http`'s
        /// `Method` of either version, so actix-web's `Method::POST` too). Methods are
        /// case-sensitive. `build` refuses an empty list
        /// ([`ConfigError::NoMethods`](crate::ConfigError::NoMethods)) and a name that is
        /// not a method, or a standard one in the wrong case such as `post`
        /// ([`ConfigError::InvalidMethod`](crate::ConfigError::InvalidMethod)).
        ///
        /// ```
        /// use tower_lock::{LockEngine, LockLayer, http::Method, key::PathKey};
        ///
        /// let layer = LockLayer::builder(LockEngine::in_memory())
        ///     .key(PathKey)
        ///     .methods(["POST", "PUT", "DELETE"])
        ///     .build()
        ///     .unwrap();
        /// // The same, by type.
        /// let same = LockLayer::builder(LockEngine::in_memory())
        ///     .key(PathKey)
        ///     .methods([Method::POST, Method::PUT, Method::DELETE])
        ///     .build()
        ///     .unwrap();
        /// # let _ = (layer, same);
        /// ```
        pub fn methods<M: AsRef<str>>(mut self, methods: impl IntoIterator<Item = M>) -> Self {
            self.settings.methods(methods);
            self
        }

        /// What to do with a request without a key. Default:
        /// [`MissingKeyPolicy::Reject`](crate::MissingKeyPolicy::Reject) (`400`).
        pub fn on_missing_key(mut self, policy: $crate::MissingKeyPolicy) -> Self {
            self.settings.missing = policy;
            self
        }

        /// The lease length; renewed while the request runs, so it bounds how long a
        /// crashed node blocks the key (and, under idempotency, how soon a retry runs again
        /// after the process running the first request died), not how long a request may
        /// take. At least 1 ms and at most a day, or `build` fails. Default: 30 s.
        pub fn ttl(mut self, ttl: std::time::Duration) -> Self {
            self.settings.ttl(ttl);
            self
        }

        /// How long a request waits for a held key. `Duration::ZERO` (the default) answers
        /// at once: `423 Locked` (`409 Conflict` under idempotency). Otherwise a wait that
        /// runs out is answered `429 Too Many Requests`; under idempotency a duplicate that
        /// waits for the request in flight then receives its replay.
        pub fn wait(mut self, wait: std::time::Duration) -> Self {
            self.settings.wait(wait);
            self
        }

        /// Grant waiting requests the key in arrival order. Needs a wait limit. Default: off.
        pub fn fifo(mut self, fifo: bool) -> Self {
            self.settings.fifo(fifo);
            self
        }

        /// At most `max` requests wait per key; more are answered `429` at once. Needs a
        /// wait limit, and at least 1 (with no room to wait, set no wait limit instead: a
        /// held key is then answered at once). Default: no limit.
        pub fn max_waiters(mut self, max: usize) -> Self {
            self.settings.max_waiters(max);
            self
        }

        /// What to do when the backend fails. Default:
        /// [`BackendFailurePolicy::FailClosed`](crate::BackendFailurePolicy::FailClosed)
        /// (the only policy idempotency accepts: running without the record would run a
        /// completed request twice).
        pub fn on_backend_failure(mut self, policy: $crate::BackendFailurePolicy) -> Self {
            self.settings.backend_failure = policy;
            self
        }

        /// The `Retry-After` sent when nothing better is known: a `503`, or contention
        /// before the layer has observed a hold (after that, the 95th percentile of its
        /// recent hold times). Set it to how long your handler usually takes if that is
        /// much more than a second. Never more than the holder's remaining lease; rounded
        /// up to whole seconds, at least 1. Default: 1 s.
        pub fn retry_after_fallback(mut self, d: std::time::Duration) -> Self {
            self.settings.retry_after_fallback(d);
            self
        }

        /// Build rejection responses with `hook` instead of the default problem+json.
        pub fn on_reject<F>(mut self, hook: F) -> Self
        where
            F: Fn($crate::Rejection) -> http::Response<bytes::Bytes> + Send + Sync + 'static,
        {
            self.settings.on_reject(hook);
            self
        }

        /// The base of the problem `type` URIs of rejections, so they point at your own
        /// documentation: `https://example.com/problems/` makes a `423` answer with
        /// `"type": "https://example.com/problems/locked"` (the base followed by
        /// [`RejectionKind::slug`](crate::RejectionKind::slug)). Default: the
        /// `urn:tower-lock:problem:` URNs. A base that is not a valid URI is refused by
        /// `build`. Every rejection also carries `instance`, the request path (RFC 9457).
        pub fn problem_type_base(mut self, base: impl Into<String>) -> Self {
            self.settings.problem_type_base(base.into());
            self
        }

        /// The layer's name in its metrics (the `layer` label of every series recorded
        /// through the `metrics` facade, see [`metrics`](crate::metrics)) and in its outage
        /// logs. Default: the namespace, or the key extractor's
        /// [kind](crate::key::KeyExtractor::kind) when the namespace is empty
        /// (`idempotency-key` under idempotency).
        pub fn metrics_name(mut self, name: impl Into<String>) -> Self {
            self.settings.metrics_name(name.into());
            self
        }
    };
}

pub(crate) use lock_setters;
