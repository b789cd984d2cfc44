//! [`LockSettings`]: the lock settings both middlewares are built with, checked in one
//! place, and the one rule for which of them each builder exposes.
//!
//! tower-lock's `LockLayerBuilder` and `IdempotencyLayerBuilder` lock the same way: each
//! holds a `LockSettings` and gets its setters from tower-lock's `lock_setters!`, so the two
//! offer every shared setting under the same name, with the same documentation and the same
//! checks.
//! Each builder adds only what is its own: the lock layer its key extractor and its
//! release point, the idempotency layer its key within a scope and what it stores.

use std::{sync::Arc, time::Duration};

use bytes::Bytes;

#[cfg(feature = "idempotency")]
pub use crate::integration::replay::{
    fingerprint::FingerprintKind,
    options::{ReplayHook, ReplayOptions, StoreFn},
    scope::Scope,
};
use crate::{
    config_error::ConfigError,
    engine::{LockEngine, LockKey, LockOptions},
    integration::{Config, LockedMethods, RejectHook, RequestLocker, Sharing},
    key::{self, KeyExtractor},
    options::{BackendFailurePolicy, MissingKeyPolicy, ReleasePoint},
    reject::{Rejection, RejectionKind},
};

/// The lock settings of a middleware under construction: what tower-lock's
/// `lock_setters!` sets and [`build_locker`](Self::build_locker) checks.
// Hidden, for tower-lock's builders: not an API
// of this crate.
#[allow(missing_docs, missing_debug_implementations)]
pub struct LockSettings {
    pub namespace: String,
    pub missing: MissingKeyPolicy,
    /// `ttl`, `wait`, `fifo` and `max_waiters`, as the engine takes them.
    pub options: LockOptions,
    /// A `ttl` under [`MIN_TTL`], kept so that the build refuses it (the engine's options
    /// would round it up).
    short_ttl: Option<Duration>,
    /// How a held key is answered when not waiting: `Locked` (423), or `Conflict` (409)
    /// under the idempotency preset.
    busy: RejectionKind,
    pub backend_failure: BackendFailurePolicy,
    pub release: ReleasePoint,
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
    pub permits: Option<u32>,
    /// `shared_for([..])`: the methods that share the key, as given; the other locked
    /// methods take it alone.
    pub shared_for: Option<Vec<String>>,
    /// `dry_run(true)`: observe only.
    pub dry_run: bool,
    /// `log_holds_longer_than(d)`: holds past `d` are logged at `info`.
    pub long_hold: Option<Duration>,
}

#[allow(clippy::new_without_default)] // tower-lock's builders say which defaults they start from
impl LockSettings {
    /// A lock layer's defaults: the engine's (a 30 s TTL, no FIFO, no waiter limit) but
    /// one: a layer does not wait for a held key unless told to.
    pub fn new() -> Self {
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
            dry_run: false,
            long_hold: None,
        }
    }

    /// The idempotency preset, after the IETF Idempotency-Key draft: the key is required,
    /// a duplicate in flight is answered `409`, and only `POST` and `PATCH` are covered.
    #[cfg_attr(not(feature = "idempotency"), allow(dead_code))]
    pub fn idempotency() -> Self {
        Self {
            missing: MissingKeyPolicy::Reject,
            busy: RejectionKind::Conflict,
            methods: Some(vec!["POST".to_owned(), "PATCH".to_owned()]),
            ..Self::new()
        }
    }

    /// Marks the settings as an idempotency layer's with replay, whose duplicates may wait.
    #[cfg_attr(not(feature = "idempotency"), allow(dead_code))]
    #[must_use]
    pub fn replaying(mut self) -> Self {
        self.replaying = true;
        self
    }

    /// Keep `error` for the build, unless an earlier setter's error is kept already (the
    /// first mistake is the one to report).
    #[cfg_attr(not(feature = "idempotency"), allow(dead_code))]
    pub fn refuse(&mut self, error: ConfigError) {
        self.refused.get_or_insert(error);
    }

    /// The error of a value a setter could not take, if any.
    pub fn check_values(&self) -> Result<(), ConfigError> {
        self.refused.clone().map_or(Ok(()), Err)
    }

    pub fn ttl(&mut self, ttl: Duration) {
        self.short_ttl = (ttl < MIN_TTL).then_some(ttl);
        self.options = std::mem::take(&mut self.options).ttl(ttl);
    }

    pub fn wait(&mut self, wait: Duration) {
        self.options = std::mem::take(&mut self.options).wait(wait);
    }

    pub fn fifo(&mut self, fifo: bool) {
        self.options = std::mem::take(&mut self.options).fifo(fifo);
    }

    pub fn max_waiters(&mut self, max: usize) {
        self.options = std::mem::take(&mut self.options).max_waiters(max);
    }

    pub fn methods<M: AsRef<str>>(&mut self, methods: impl IntoIterator<Item = M>) {
        let names = methods.into_iter().map(|m| m.as_ref().to_owned());
        self.methods = Some(names.collect());
    }

    pub fn shared_for<M: AsRef<str>>(&mut self, methods: impl IntoIterator<Item = M>) {
        let names = methods.into_iter().map(|m| m.as_ref().to_owned());
        self.shared_for = Some(names.collect());
    }

    pub fn problem_type_base(&mut self, base: String) {
        self.problem_type_base = Some(base);
    }

    pub fn metrics_name(&mut self, name: String) {
        self.metrics_name = Some(name);
    }

    pub fn retry_after_fallback(&mut self, d: Duration) {
        self.retry_after_fallback = d;
    }

    pub fn on_reject<F>(&mut self, hook: F)
    where
        F: Fn(Rejection) -> http::Response<Bytes> + Send + Sync + 'static,
    {
        self.on_reject = Some(Arc::new(hook));
    }

    /// The TTL as set (one under the engine's resolution included), for `Debug`.
    pub fn ttl_as_set(&self) -> Duration {
        self.short_ttl.unwrap_or(self.options.lease_ttl())
    }

    /// The wait limit. Never unset: the settings start from a zero wait and have no setter
    /// for an unlimited one.
    pub fn wait_limit(&self) -> Duration {
        self.options.wait_limit().unwrap_or(Duration::MAX)
    }

    /// Check the settings and build the framework-neutral runtime core that locks with
    /// them on `engine`, keyed by `extractor`.
    pub fn build_locker(
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
        let mut key_head = key::key_head(&self.namespace, extractor.kind());
        if self.dry_run {
            // Keys of its own: a dry run's leases and records never meet a real layer's.
            key_head.insert_str(0, crate::integration::DRY_RUN_MARK);
        }
        let default_name = self.metrics_name.is_none();
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
                default_name,
                dry_run: self.dry_run,
                long_hold: self.long_hold,
            },
            engine,
        ))
    }
}

/// The shortest `ttl` accepted: the engine's resolution ([`LockOptions::ttl`] rounds
/// anything under its `MIN_TTL`, 10 ms, up to that).
const MIN_TTL: Duration = Duration::from_millis(1);

/// The longest `ttl` or `wait` accepted: a day. Longer is a mistake for an HTTP request
/// (and `Duration::MAX` would overflow the clock).
const MAX_DURATION: Duration = Duration::from_secs(24 * 60 * 60);
