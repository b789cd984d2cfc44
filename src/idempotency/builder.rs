//! [`IdempotencyLayerBuilder`]: the configuration of an [`IdempotencyLayer`], checked when
//! it is built.

use std::{fmt, sync::Arc, time::Duration};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, StatusCode};

use super::layer::IdempotencyLayer;
use tower_lock_core::{
    FingerprintFn, ReplayLocker,
    settings::{FingerprintKind, LockSettings, ReplayHook, ReplayOptions, Scope, StoreFn},
};

use crate::{
    BackendFailurePolicy, ConfigError, LockLayerBuilder,
    engine::LockEngine,
    key::{IdempotencyKey, KeyExtractor, Principal, RequestView},
    setters::lock_setters,
};

/// An [`IdempotencyLayer`] under construction, from [`IdempotencyLayer::builder`]: the
/// lock settings plus what is stored and replayed.
///
/// **Which lock settings it has:** every one a [`LockLayerBuilder`] has, by the same name
/// and with the same meaning (`namespace`, `methods`, `on_missing_key`, `ttl`, `wait`,
/// `fifo`, `max_waiters`, `on_backend_failure`, `retry_after_fallback`, `on_reject`,
/// `problem_type_base`, `metrics_name`), except two that are its own: the key (here the
/// idempotency key within a scope, [`key`](Self::key)) and the release point (a request
/// that runs under its key is released when its response is stored). It has no `permits`
/// or `shared_for`: two requests with one idempotency key never run at once (after
/// [`without_replay`](Self::without_replay) they are refused by `build()`).
///
/// ```
/// use std::time::Duration;
/// use tower_lock::{IdempotencyLayer, LockEngine};
///
/// let layer = IdempotencyLayer::builder(LockEngine::in_memory())
///     .unscoped()
///     .ttl(Duration::from_secs(10))
///     .wait(Duration::from_secs(5)) // duplicates wait for the first, then get its replay
///     .max_waiters(8)
///     .build()
///     .unwrap();
/// # let _ = layer;
/// ```
#[must_use]
pub struct IdempotencyLayerBuilder {
    engine: LockEngine,
    settings: LockSettings,
    options: ReplayOptions,
    /// The idempotency key within the scope.
    key: Arc<dyn KeyExtractor>,
    /// Whether `key` is an [`IdempotencyKey`], whose values are at most
    /// [`MAX_IDEMPOTENCY_KEY_LEN`](crate::key::MAX_IDEMPOTENCY_KEY_LEN) bytes: `build` then
    /// makes sure the longest fits.
    bounded_key: bool,
    /// `None` until the user decides; `build` refuses that.
    scope: Option<Scope>,
}

impl fmt::Debug for IdempotencyLayerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let o = &self.options;
        let s = &self.settings;
        f.debug_struct("IdempotencyLayerBuilder")
            .field("namespace", &s.namespace)
            .field("ttl", &s.ttl_as_set())
            .field("wait", &s.wait_limit())
            .field("fifo", &s.options.is_fifo())
            .field("max_waiters", &s.options.waiter_limit())
            .field("key", &self.key.kind())
            .field("scope", &self.scope)
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

/// How long the body of a response whose client left is read for its record, unless set
/// otherwise: long enough for any response that ends, short enough that a stream that
/// never ends (server-sent events answering a keyed `POST`) frees its key.
const DEFAULT_MAX_DRAIN_TIME: Duration = Duration::from_secs(60);

impl IdempotencyLayerBuilder {
    pub(crate) fn new(engine: LockEngine) -> Self {
        Self {
            engine,
            settings: LockSettings::idempotency(),
            options: ReplayOptions {
                replayed_header: HeaderName::from_static("idempotent-replayed"),
                store_server_errors: false,
                max_response_body: 1 << 20,
                max_response_headers: 16 << 10,
                max_request_body: 1 << 20,
                retention: DEFAULT_RETENTION,
                max_drain_time: DEFAULT_MAX_DRAIN_TIME,
                fingerprint_headers: Vec::new(),
                fingerprint: FingerprintKind::default(),
                store_if: None,
                on_replay: None,
                scope: Scope::Unscoped,
            },
            key: Arc::new(IdempotencyKey::new()),
            bounded_key: true,
            scope: None,
        }
    }

    /// `name` as a header name for the setter `option`, or `None` with the error kept for
    /// `build` (also after [`without_replay`](Self::without_replay)).
    fn header_name(&mut self, option: &'static str, name: &str) -> Option<HeaderName> {
        let parsed = HeaderName::from_bytes(name.as_bytes()).ok();
        if parsed.is_none() {
            self.settings.refuse(ConfigError::InvalidHeaderName {
                option,
                name: name.to_owned(),
            });
        }
        parsed
    }

    #[doc = include_str!("../docs/per_principal.md")]
    pub fn per_principal<P>(self) -> Self
    where
        P: std::fmt::Display + Send + Sync + 'static,
    {
        self.scope_by(Principal::<P>::new())
    }

    /// Scope records by what `scope` extracts from the request: a tenant the server
    /// derived, a principal read by a closure. Only use a value the server vouches for
    /// (set by an authentication layer or a gateway that strips it from client input): a
    /// header the client sets freely lets a client choose whose records it shares. A
    /// request in which the scope finds nothing (a closure returning `None`) is the
    /// server's mistake, as for [`per_principal`](Self::per_principal): `500
    /// misconfigured`, its cause logged (an authentication middleware missing or ordered
    /// after this layer); a client cannot send a scope. The layer is keyed by
    /// [`ScopedKey::by(scope, key)`](crate::key::ScopedKey::by), as a lock layer would be.
    ///
    /// ```
    /// use tower_lock::{IdempotencyLayer, LockEngine, key};
    ///
    /// /// Set by the API gateway after it checked the caller's token (and stripped from
    /// /// what clients send).
    /// const VERIFIED_TENANT: &str = "x-verified-tenant";
    ///
    /// let layer = IdempotencyLayer::builder(LockEngine::in_memory())
    ///     .scope_by(key::from_fn("verified-tenant", |req| {
    ///         req.header_str(VERIFIED_TENANT).map(str::to_owned)
    ///     }))
    ///     .build()
    ///     .unwrap();
    /// # let _ = layer;
    /// ```
    pub fn scope_by(mut self, scope: impl KeyExtractor) -> Self {
        self.scope = Some(Scope::By(Arc::new(scope)));
        self
    }

    /// Share records among every caller: a key sent by anyone replays the response stored
    /// for anyone else who sent it. Only for anonymous public endpoints, where there is no
    /// caller identity to scope by and the responses hold nothing private.
    pub fn unscoped(mut self) -> Self {
        self.scope = Some(Scope::Unscoped);
        self
    }

    /// Keep today's behaviour of the preset without replay: a duplicate in flight is
    /// answered `409`, a retry after completion runs again, nothing is stored and the
    /// request body is not read by the layer. Returns the plain [`LockLayerBuilder`],
    /// keyed by the idempotency key within the scope (unscoped when none was chosen:
    /// without records there is nothing to hand to another caller).
    pub fn without_replay(self) -> LockLayerBuilder {
        let key = self.scope.unwrap_or(Scope::Unscoped).key(self.key);
        LockLayerBuilder::with_settings(self.engine, self.settings, Some(key))
    }

    /// The idempotency key within the scope (default: the `Idempotency-Key` header, see
    /// [`IdempotencyKey`]). The scope is set apart: [`per_principal`](Self::per_principal),
    /// [`scope_by`](Self::scope_by) or [`unscoped`](Self::unscoped).
    pub fn key(mut self, extractor: impl KeyExtractor) -> Self {
        self.key = Arc::new(extractor);
        self.bounded_key = false;
        self
    }

    /// Read the idempotency key from the header called `name` instead of
    /// `Idempotency-Key` (`X-Idempotency-Key` is common), with the same syntax. The name
    /// is text or a `HeaderName` of either `http` version; one that is not a header name
    /// is refused by `build` ([`ConfigError::InvalidHeaderName`]).
    ///
    /// ```
    /// use tower_lock::{IdempotencyLayer, LockEngine};
    ///
    /// let layer = IdempotencyLayer::builder(LockEngine::in_memory())
    ///     .key_header("X-Idempotency-Key")
    ///     .unscoped()
    ///     .build()
    ///     .unwrap();
    /// # let _ = layer;
    /// ```
    pub fn key_header(mut self, name: impl AsRef<str>) -> Self {
        match self.header_name("key_header", name.as_ref()) {
            Some(name) => Self {
                bounded_key: true,
                ..self.key(IdempotencyKey::header(name))
            },
            None => self,
        }
    }

    lock_setters!();

    /// The header added to replayed responses, with the value `true` (default
    /// `Idempotent-Replayed`). The name is text or a `HeaderName` of either `http`
    /// version; one that is not a header name is refused by `build`
    /// ([`ConfigError::InvalidHeaderName`]).
    pub fn replayed_header(mut self, name: impl AsRef<str>) -> Self {
        if let Some(name) = self.header_name("replayed_header", name.as_ref()) {
            self.options.replayed_header = name;
        }
        self
    }

    /// Also store (and replay) `5xx` responses, as Stripe does (default: not stored, so a
    /// retry runs again). A `5xx` with `Retry-After` is never stored, nor `503`: they say
    /// "try again".
    pub fn store_server_errors(mut self, store: bool) -> Self {
        self.options.store_server_errors = store;
        self
    }

    #[doc = include_str!("../docs/store_if.md")]
    pub fn store_if<F>(mut self, f: F) -> Self
    where
        F: Fn(StatusCode, &HeaderMap) -> bool + Send + Sync + 'static,
    {
        let f: StoreFn = Arc::new(f);
        self.options.store_if = Some(f);
        self
    }

    /// Adjust every replayed response before it is sent (it already carries the
    /// [replayed header](Self::replayed_header)): add a header, rewrite a field.
    ///
    /// ```
    /// use bytes::Bytes;
    /// use http::HeaderValue;
    /// use tower_lock::{IdempotencyLayer, LockEngine};
    ///
    /// let layer = IdempotencyLayer::builder(LockEngine::in_memory())
    ///     .unscoped()
    ///     .on_replay(|res: &mut http::Response<Bytes>| {
    ///         res.headers_mut().insert("cache-control", HeaderValue::from_static("no-store"));
    ///     })
    ///     .build()
    ///     .unwrap();
    /// # let _ = layer;
    /// ```
    pub fn on_replay<F>(mut self, f: F) -> Self
    where
        F: Fn(&mut http::Response<Bytes>) + Send + Sync + 'static,
    {
        let f: ReplayHook = Arc::new(f);
        self.options.on_replay = Some(f);
        self
    }

    /// How long the rest of a response body is read after its client left, to store it
    /// (default 60 s), counted from the later of the client's departure and the start of
    /// the body's read (a client that left during the handler: from its answer). A body still going when this runs out (a stream that never ends)
    /// is recorded as completed but not stored: a retry gets `409` `response-not-stored`,
    /// never a second run, and the key is released. A gRPC response whose status was still
    /// to come in its trailers is read up to them whatever its size; cut off before them,
    /// it has no status and is not recorded: the key is released and a retry runs.
    pub fn max_drain_time(mut self, limit: Duration) -> Self {
        self.options.max_drain_time = limit;
        self
    }

    /// The largest response body stored (default 1 MiB). A larger response completes
    /// normally, and a retry is answered `409` `response-not-stored` with the original
    /// status, never run again. A larger gRPC response whose status comes in its trailers
    /// is still judged by that status: a "try again" (`UNAVAILABLE`, …) is not recorded,
    /// and its retry runs.
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
    /// version header, say), every value of each. Names are text or `HeaderName`s of
    /// either `http` version; one that is not a header name is refused by `build`
    /// ([`ConfigError::InvalidHeaderName`]).
    ///
    /// ```
    /// use tower_lock::{IdempotencyLayer, LockEngine};
    ///
    /// let layer = IdempotencyLayer::builder(LockEngine::in_memory())
    ///     .unscoped()
    ///     .fingerprint_headers(["API-Version", "Accept-Language"])
    ///     .build()
    ///     .unwrap();
    /// # let _ = layer;
    /// ```
    pub fn fingerprint_headers<N: AsRef<str>>(
        mut self,
        names: impl IntoIterator<Item = N>,
    ) -> Self {
        let names: Vec<_> = names
            .into_iter()
            .filter_map(|name| self.header_name("fingerprint_headers", name.as_ref()))
            .collect();
        self.options.fingerprint_headers = names;
        self
    }

    /// Fingerprint a JSON body in one form rather than by its bytes: whitespace between
    /// tokens dropped, object members sorted by name, strings written in one form, so
    /// `{"a":1, "b":2}` and `{"b": 2,"a":1}` are the same request. Nothing else is
    /// forgiven: numbers stay exactly as written, never through a float (`1` and `1.0`
    /// differ, and so do `0.1` and `0.10000000000000001`), array order counts, and a member
    /// sent twice counts twice, in its order (`{"to":"a","to":"b"}` is not `{"to":"b"}`).
    /// The rest of the fingerprint is unchanged; a body that is not JSON counts by its bytes.
    ///
    /// ```
    /// use tower_lock::{IdempotencyLayer, LockEngine};
    ///
    /// let layer = IdempotencyLayer::builder(LockEngine::in_memory())
    ///     .unscoped()
    ///     .canonical_json()
    ///     .build()
    ///     .unwrap();
    /// # let _ = layer;
    /// ```
    pub fn canonical_json(mut self) -> Self {
        self.options.fingerprint.canonical_json = true;
        self
    }

    /// Count the authority (the host name and port the client addressed) in the
    /// fingerprint: a key reused under another host name is then a `422`.
    ///
    /// Off by default: the nodes of one service answer the same resources under several
    /// addresses (each node's own, an internal and an external name, another region's after
    /// a failover), and a client's retry of the same request on any of them is replayed.
    /// Turn it on for a layer in front of several hosts whose names select different
    /// resources, or scope the keys by the host with [`scope_by(AuthorityKey::new())`](crate::key::AuthorityKey)
    /// (HTTP/2 requests have no `Host` header to key on), so each host has its own records.
    pub fn fingerprint_authority(mut self) -> Self {
        self.options.fingerprint.authority = true;
        self
    }

    /// Add a part of the application's own to the fingerprint: `f` gets the request and
    /// its whole body, and what it returns counts besides the default fingerprint (SHA-256
    /// over the method, the full original target with its query, the content type, the [named headers](Self::fingerprint_headers) and the body, or its
    /// [canonical JSON](Self::canonical_json)), never instead of it. Two requests with one
    /// key are the same request only when both agree, so a part can tell apart requests
    /// the default would take for one (what an earlier layer put in the extensions, a
    /// setting the handler reads from elsewhere), and can never make a request with
    /// another query or route the same as the stored one.
    ///
    /// ```
    /// use tower_lock::{IdempotencyLayer, LockEngine, bytes::Bytes, key::RequestView};
    ///
    /// /// The API version a gateway layer resolved for the caller (from its account
    /// /// settings, not a header), which changes what the handler does.
    /// #[derive(Clone)]
    /// struct ApiVersion(&'static str);
    ///
    /// fn api_version(req: &dyn RequestView, _body: &[u8]) -> Bytes {
    ///     let version = req.extensions().and_then(|e| e.get::<ApiVersion>());
    ///     Bytes::from_static(version.map_or("", |v| v.0).as_bytes())
    /// }
    ///
    /// let mut req = tower_lock::http::Request::post("/orders").body(()).unwrap();
    /// req.extensions_mut().insert(ApiVersion("2026-11-01"));
    /// assert_eq!(api_version(&req, b"{}"), "2026-11-01");
    ///
    /// let layer = IdempotencyLayer::builder(LockEngine::in_memory())
    ///     .unscoped()
    ///     .fingerprint_with(api_version)
    ///     .build()
    ///     .unwrap();
    /// # let _ = layer;
    /// ```
    pub fn fingerprint_with<F>(mut self, f: F) -> Self
    where
        F: Fn(&dyn RequestView, &[u8]) -> Bytes + Send + Sync + 'static,
    {
        let f: FingerprintFn = Arc::new(f);
        self.options.fingerprint.extra = Some(f);
        self
    }

    /// Check the configuration and build the layer. Besides the lock settings' checks: the
    /// header names must be valid ([`ConfigError::InvalidHeaderName`]), a scope must have
    /// been chosen ([`ConfigError::IdempotencyScope`]), the failure policy must be
    /// fail-closed ([`ConfigError::IdempotencyFailurePolicy`]), the engine's backend must
    /// keep records ([`ConfigError::RecordsUnsupported`]), the limits must be above zero,
    /// the retention at most [`MAX_TTL`](crate::engine::MAX_TTL), and the namespace must
    /// leave room for the longest legal key under any scope ([`ConfigError::Namespace`]).
    pub fn build(self) -> Result<IdempotencyLayer, ConfigError> {
        self.build_core().map(IdempotencyLayer::new)
    }

    /// Keep the records in the application's own Postgres database, committed in the
    /// same transaction as the handler's writes: exactly once for database writes (see
    /// [`transactional`](super::transactional)). Every setting made so far keeps its
    /// meaning (scope, key, fingerprint, store policy, limits, problem bodies, `wait`,
    /// `retry_after_fallback`, metrics, `on_replay`); the lock settings `ttl`, `fifo` and
    /// `max_waiters` have no effect: the records table's unique index orders duplicates.
    #[cfg(feature = "postgres")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    pub fn transactional(
        self,
        pool: sqlx::PgPool,
    ) -> super::transactional::TransactionalLayerBuilder {
        super::transactional::TransactionalLayerBuilder::new(self, pool)
    }

    /// Check the configuration and build the framework-neutral core the layer runs on.
    pub(super) fn build_core(mut self) -> Result<ReplayLocker, ConfigError> {
        self.settings.check_values()?;
        let scope = self.scope.take().ok_or(ConfigError::IdempotencyScope)?;
        // Running without the record (open, or on a node-local lock that cannot read it)
        // would run a completed request a second time.
        let policy = self.settings.backend_failure;
        if policy != BackendFailurePolicy::FailClosed {
            return Err(ConfigError::IdempotencyFailurePolicy(policy));
        }
        self.options.check()?;
        if !self.engine.has_records() {
            return Err(ConfigError::RecordsUnsupported);
        }
        let key = scope.key(self.key);
        if self.bounded_key {
            scope.check_room(&self.settings.namespace, key.kind())?;
        }
        let locker = self
            .settings
            .replaying()
            .build_locker(self.engine, Some(key))?;
        self.options.scope = scope;
        Ok(ReplayLocker::new(locker, self.options))
    }
}
