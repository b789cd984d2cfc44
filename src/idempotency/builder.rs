//! [`IdempotencyLayerBuilder`]: the configuration of an [`IdempotencyLayer`], checked when
//! it is built.

use std::{fmt, sync::Arc, time::Duration};

use bytes::Bytes;
use http::HeaderName;

use super::{
    fingerprint::FingerprintFn,
    layer::IdempotencyLayer,
    replay_locker::{ReplayLocker, ReplayOptions},
};
use crate::{
    BackendFailurePolicy, ConfigError, LockLayerBuilder, engine::MAX_TTL, key::KeyExtractor,
    key::RequestView, reject::Rejection,
};

/// An [`IdempotencyLayer`] under construction, from
/// [`LockLayer::idempotency`](crate::LockLayer::idempotency): the lock settings of a
/// [`LockLayerBuilder`] plus what is stored and replayed.
#[must_use]
pub struct IdempotencyLayerBuilder {
    lock: LockLayerBuilder,
    options: ReplayOptions,
}

impl fmt::Debug for IdempotencyLayerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let o = &self.options;
        f.debug_struct("IdempotencyLayerBuilder")
            .field("lock", &self.lock)
            .field("retention", &o.retention)
            .field("max_request_body", &o.max_request_body)
            .field("max_response_body", &o.max_response_body)
            .field("max_response_headers", &o.max_response_headers)
            .field("store_server_errors", &o.store_server_errors)
            .finish_non_exhaustive()
    }
}

/// Stored responses are kept for a day unless set otherwise.
const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 60 * 60);

impl IdempotencyLayerBuilder {
    pub(crate) fn new(lock: LockLayerBuilder) -> Self {
        IdempotencyLayerBuilder {
            lock,
            options: ReplayOptions {
                replayed_header: HeaderName::from_static("idempotent-replayed"),
                store_server_errors: false,
                max_response_body: 1 << 20,
                max_response_headers: 16 << 10,
                max_request_body: 1 << 20,
                retention: DEFAULT_RETENTION,
                fingerprint_headers: Vec::new(),
                fingerprint: None,
            },
        }
    }

    /// Keep today's behaviour of the preset without replay: a duplicate in flight is
    /// answered `409`, a retry after completion runs again, nothing is stored and the
    /// request body is not read by the layer. Returns the plain [`LockLayerBuilder`].
    pub fn without_replay(self) -> LockLayerBuilder {
        self.lock
    }

    /// Change the lock settings (anything a [`LockLayerBuilder`] sets: TTL, FIFO, waiter
    /// limit, failure policy, rejection hook, ...).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_lock::{LockEngine, LockLayer};
    ///
    /// let layer = LockLayer::idempotency(LockEngine::in_memory())
    ///     .lock(|l| l.ttl(Duration::from_secs(10)).max_waiters(8))
    ///     .wait(Duration::from_secs(5))
    ///     .build()
    ///     .unwrap();
    /// # let _ = layer;
    /// ```
    pub fn lock(mut self, f: impl FnOnce(LockLayerBuilder) -> LockLayerBuilder) -> Self {
        self.lock = f(self.lock);
        self
    }

    /// The key extractor (default: the `Idempotency-Key` header); see
    /// [`LockLayerBuilder::key`].
    pub fn key(self, extractor: impl KeyExtractor) -> Self {
        self.lock(|l| l.key(extractor))
    }

    /// The namespace of the layer's keys and records; see [`LockLayerBuilder::namespace`].
    pub fn namespace(self, namespace: impl Into<String>) -> Self {
        self.lock(|l| l.namespace(namespace))
    }

    /// The methods the layer covers (default `POST` and `PATCH`); others pass through.
    pub fn methods(self, methods: impl IntoIterator<Item = http::Method>) -> Self {
        self.lock(|l| l.methods(methods))
    }

    /// How long a duplicate waits for the request in flight, then receives its replay
    /// (default zero: answered `409` at once).
    pub fn wait(self, wait: Duration) -> Self {
        self.lock(|l| l.wait(wait))
    }

    /// Serve waiting duplicates in arrival order.
    pub fn fifo(self, fifo: bool) -> Self {
        self.lock(|l| l.fifo(fifo))
    }

    /// The lock's lease TTL: how soon a retry runs again after the process running the
    /// first request died (default 30 s).
    pub fn ttl(self, ttl: Duration) -> Self {
        self.lock(|l| l.ttl(ttl))
    }

    /// What to do when the backend fails; see [`BackendFailurePolicy`]. Under
    /// [`Degrade`](BackendFailurePolicy::Degrade) nothing is stored while it is down.
    pub fn on_backend_failure(self, policy: BackendFailurePolicy) -> Self {
        self.lock(|l| l.on_backend_failure(policy))
    }

    /// The base URI of problem types; see [`LockLayerBuilder::problem_type_base`].
    pub fn problem_type_base(self, base: impl Into<String>) -> Self {
        self.lock(|l| l.problem_type_base(base))
    }

    /// The layer's name in its metrics and outage logs; see
    /// [`LockLayerBuilder::metrics_name`].
    pub fn metrics_name(self, name: impl Into<String>) -> Self {
        self.lock(|l| l.metrics_name(name))
    }

    /// Build rejection responses with `hook`; see [`LockLayerBuilder::on_reject`].
    pub fn on_reject<F>(self, hook: F) -> Self
    where
        F: Fn(Rejection) -> http::Response<Bytes> + Send + Sync + 'static,
    {
        self.lock(|l| l.on_reject(hook))
    }

    /// The header added to replayed responses, with the value `true` (default
    /// `Idempotent-Replayed`).
    pub fn replayed_header(mut self, name: HeaderName) -> Self {
        self.options.replayed_header = name;
        self
    }

    /// Also store (and replay) `5xx` responses, as Stripe does (default: not stored, so a
    /// retry runs again). `408`, `425` and `429` are never stored.
    pub fn store_server_errors(mut self, store: bool) -> Self {
        self.options.store_server_errors = store;
        self
    }

    /// The largest response body stored (default 1 MiB). A larger response completes
    /// normally, and a retry is answered `409` `response-not-stored` with the original
    /// status, never run again.
    pub fn max_response_body(mut self, bytes: usize) -> Self {
        self.options.max_response_body = bytes;
        self
    }

    /// The most bytes of response headers (names and values) stored (default 16 KiB);
    /// over it, as for [`max_response_body`](Self::max_response_body).
    pub fn max_response_headers(mut self, bytes: usize) -> Self {
        self.options.max_response_headers = bytes;
        self
    }

    /// The largest request body read and fingerprinted (default 1 MiB); a larger one is
    /// answered `413`.
    pub fn max_request_body(mut self, bytes: usize) -> Self {
        self.options.max_request_body = bytes;
        self
    }

    /// How long a completed response is kept for replay (default 24 hours). After it, the
    /// key may be used again.
    pub fn retention(mut self, retention: Duration) -> Self {
        self.options.retention = retention;
        self
    }

    /// Headers that are part of the default fingerprint besides the content type (an API
    /// version header, say).
    pub fn fingerprint_headers(mut self, names: impl IntoIterator<Item = HeaderName>) -> Self {
        self.options.fingerprint_headers = names.into_iter().collect();
        self
    }

    /// Replace the default fingerprint (SHA-256 over the method, path, query, content
    /// type, the [named headers](Self::fingerprint_headers) and the body) with `f`, which
    /// gets the request and its whole body: for example a hash of canonical JSON.
    ///
    /// ```
    /// use bytes::Bytes;
    /// use tower_lock::{LockEngine, LockLayer, key::RequestView};
    ///
    /// let layer = LockLayer::idempotency(LockEngine::in_memory())
    ///     // Whitespace in a JSON body does not make it a different request.
    ///     .fingerprint_with(|req: &dyn RequestView, body: &[u8]| {
    ///         let compact: Vec<u8> = body.iter().copied().filter(|b| !b.is_ascii_whitespace()).collect();
    ///         Bytes::from([req.path().as_bytes(), b"\0", &compact].concat())
    ///     })
    ///     .build()
    ///     .unwrap();
    /// # let _ = layer;
    /// ```
    pub fn fingerprint_with<F>(mut self, f: F) -> Self
    where
        F: Fn(&dyn RequestView, &[u8]) -> Bytes + Send + Sync + 'static,
    {
        let f: FingerprintFn = Arc::new(f);
        self.options.fingerprint = Some(f);
        self
    }

    /// Check the configuration and build the layer. Besides the lock settings' checks:
    /// the engine's backend must keep records ([`ConfigError::RecordsUnsupported`]), the
    /// limits must be above zero and the retention at most [`MAX_TTL`].
    pub fn build(self) -> Result<IdempotencyLayer, ConfigError> {
        self.build_replay_locker().map(IdempotencyLayer::new)
    }

    /// Check the configuration and build the framework-neutral core (for framework
    /// integrations).
    pub fn build_replay_locker(self) -> Result<ReplayLocker, ConfigError> {
        let o = &self.options;
        for (name, value) in [
            ("max_request_body", o.max_request_body),
            ("max_response_body", o.max_response_body),
            ("max_response_headers", o.max_response_headers),
        ] {
            if value == 0 {
                return Err(ConfigError::ZeroLimit(name));
            }
        }
        if o.retention < Duration::from_millis(1) {
            return Err(ConfigError::ZeroLimit("retention"));
        }
        if o.retention > MAX_TTL {
            return Err(ConfigError::TooLong("retention"));
        }
        if !self.lock.engine().has_records() {
            return Err(ConfigError::RecordsUnsupported);
        }
        let locker = self.lock.replaying().build_locker()?;
        Ok(ReplayLocker::new(locker, self.options))
    }
}
