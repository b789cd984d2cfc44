//! [`RequestLocker`]: a layer's configuration and shared state, and what it answers about a
//! request (its lock key, whether its method is locked, the response for a rejection). The
//! acquisition itself is in `acquisition.rs`.
//!
//! With the `idempotency` feature, also what only replay asks of it: the record read
//! within the acquisition, and the outage log of a record read that failed.

use std::{fmt, sync::Arc, time::Duration};

use bytes::Bytes;

#[cfg(feature = "idempotency")]
use tokio::time::Instant;

#[cfg(feature = "idempotency")]
use super::Outcome;
use super::route_labels::RouteLabels;
use super::{
    config::Config,
    layer_names::LayerNames,
    misconfig_log::MisconfigLog,
    outage::OutageLog,
    unrouted::{UnroutedLog, is_unrouted},
};
#[cfg(feature = "idempotency")]
use crate::engine::{Acquired, LockError, Mode, Record};
use crate::{
    ConfigError, KeyError,
    engine::{LockEngine, LockKey},
    key::{ExtractErrorKind, RequestView},
    metrics::LockMetrics,
    not_stored::NotStored,
    options::{BackendFailurePolicy, MissingKeyPolicy, ReleasePoint},
    reject::{Rejection, RejectionKind},
};

/// What every clone of a [`RequestLocker`] shares.
pub(super) struct Shared {
    pub(super) config: Config,
    pub(super) engine: LockEngine,
    /// The in-process engine of the degrade policy, created with the locker so that every
    /// service built from one layer shares it.
    pub(super) local: Option<LockEngine>,
    pub(super) metrics: LockMetrics,
    pub(super) outage: OutageLog,
    /// Extraction failures that are the server's mistake.
    pub(super) misconfig: MisconfigLog,
    /// Requests that reached the layer around a router's fallback.
    pub(super) unrouted: UnroutedLog,
    /// The engine's label with each route template, made once.
    pub(super) route_labels: RouteLabels,
}

/// The runtime core of a layer, shared by the tower `LockLayer` and
/// framework integrations: key extraction, contention and failure handling, and the shared
/// state they act on (the engine, the in-process fallback engine, the metrics). Cheap to
/// clone; clones share one lock table and one set of metrics.
///
/// Built by `LockLayerBuilder::build_locker`, or
/// taken from a layer with `LockLayer::locker`.
#[derive(Clone)]
pub struct RequestLocker {
    pub(super) shared: Arc<Shared>,
}

impl fmt::Debug for RequestLocker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.shared.config;
        f.debug_struct("RequestLocker")
            .field("namespace", &c.namespace)
            .field("kind", &c.extractor.kind())
            .field("missing", &c.missing)
            .field("ttl", &c.options.lease_ttl())
            .field("wait", &c.wait)
            .field("fifo", &c.options.is_fifo())
            .field("max_waiters", &c.options.waiter_limit())
            .field("backend_failure", &c.backend_failure)
            .field("release", &c.release)
            .field("permits", &c.sharing.as_ref().map(|s| s.permits()))
            .field(
                "shared_for",
                &c.sharing.as_ref().and_then(|s| s.shared_methods()),
            )
            .finish_non_exhaustive()
    }
}

impl RequestLocker {
    pub(crate) fn new(config: Config, engine: LockEngine) -> Self {
        let local =
            (config.backend_failure == BackendFailurePolicy::Degrade).then(LockEngine::in_memory);
        let metrics = LockMetrics::new(&config.name, config.long_hold);
        let default_name = config.default_name;
        let shared = Arc::new(Shared {
            config,
            engine,
            local,
            metrics,
            outage: OutageLog::default(),
            misconfig: MisconfigLog::default(),
            unrouted: UnroutedLog::default(),
            route_labels: RouteLabels::default(),
        });
        LayerNames::register(&shared, default_name);
        Self { shared }
    }

    /// The lock key of `req` (`<namespace>/<kind>/<value>`, see
    /// [`key`](crate::key#the-lock-key)), validated: `Ok(None)` when it has none and the
    /// missing-key policy lets it pass, a `400` rejection when it has none and the policy
    /// requires one (naming what is missing), or when it is malformed or too long, and a
    /// `500` rejection (logged, throttled) when the server's own setup cannot derive it.
    pub fn key(&self, req: &dyn RequestView) -> Result<Option<LockKey>, Rejection> {
        let c = &self.shared.config;
        // Borrowed where the extractor can: the value is copied once, into the key.
        let raw = match c.extractor.extract_ref(req) {
            Ok(Some(raw)) => raw,
            Ok(None) => return self.missing(None),
            Err(e) => {
                return match e.kind() {
                    ExtractErrorKind::Missing => self.missing(Some(e.reason())),
                    ExtractErrorKind::Malformed => {
                        Err(self.reject(RejectionKind::MalformedKey, e.reason().to_owned(), None))
                    }
                    // The cause goes to the operator's log; the client learns only that
                    // the fault is not theirs.
                    _ => {
                        self.shared
                            .misconfig
                            .failed(&c.name, req.path(), e.reason());
                        Err(self.reject(
                            RejectionKind::Misconfigured,
                            "the server could not derive this request's lock key; the fault is in its configuration and has been logged".to_owned(),
                            None,
                        ))
                    }
                };
            }
        };
        self.key_for(&raw).map(Some).map_err(|e| {
            self.reject(
                RejectionKind::MalformedKey,
                format!("the lock key is unusable: {e}"),
                None,
            )
        })
    }

    /// A request without a key (`what` it lacks, when the extractor said): pass through,
    /// or `400` naming the missing part.
    fn missing(&self, what: Option<&str>) -> Result<Option<LockKey>, Rejection> {
        match self.shared.config.missing {
            MissingKeyPolicy::PassThrough => Ok(None),
            MissingKeyPolicy::Reject => {
                let detail = match what {
                    Some(what) => {
                        format!("this endpoint requires a lock key: the request lacks {what}")
                    }
                    None => "this endpoint requires a lock key: the request has none".to_owned(),
                };
                Err(self.reject(RejectionKind::MissingKey, detail, None))
            }
        }
    }

    /// The key this locker takes for a request whose extractor gives `value`:
    /// `<namespace>/<kind>/<value>` (see [`key`](crate::key#the-lock-key)). Take it on
    /// the engine with `LockEngine::lock_on` to exclude the layer's requests for that
    /// value, for example from a background job.
    ///
    /// ```
    /// use http::HeaderName;
    /// use tower_lock::{LockEngine, LockLayer, key::HeaderKey};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let engine = LockEngine::in_memory();
    /// let layer = LockLayer::builder(engine.clone())
    ///     .namespace("billing")
    ///     .key(HeaderKey::new(HeaderName::from_static("x-tenant-id")))
    ///     .build()
    ///     .unwrap();
    /// let key = layer.locker().key_for("acme").unwrap();
    /// assert_eq!(key.as_str(), "billing/header=x-tenant-id/acme");
    /// // Held, it keeps the layer's requests for tenant acme out.
    /// let job = engine.lock_on(key).acquire().await.unwrap();
    /// # drop(job);
    /// # }
    /// ```
    pub fn key_for(&self, value: &str) -> Result<LockKey, KeyError> {
        // Built in place: one allocation per request, not a `String` and then its copy.
        LockKey::joined(&self.shared.config.key_head, value)
    }

    /// The former name of [`key_for`](Self::key_for): it makes a key, and locks nothing.
    #[deprecated(note = "renamed `key_for`: it makes the key, `LockEngine::lock_on` takes it")]
    pub fn lock_key(&self, value: &str) -> Result<LockKey, KeyError> {
        self.key_for(value)
    }

    /// The layer's namespace (empty unless set with
    /// `namespace`).
    pub fn namespace(&self) -> &str {
        &self.shared.config.namespace
    }

    /// Whether `req` matched no route of the axum router around the layer (the layer wraps
    /// the router's fallback: `Router::layer` instead of `Router::route_layer`): then it
    /// passes through unlocked, keeping its `404` or `405`, and the first is logged. Always
    /// `false` without the `axum` feature.
    pub(crate) fn passes_unrouted(&self, req: &dyn RequestView) -> bool {
        if !is_unrouted(req) {
            return false;
        }
        self.shared
            .unrouted
            .passed(&self.shared.config.name, req.path());
        self.shared.metrics.unlocked();
        true
    }

    /// Whether requests with `method` take a lock (`LockLayerBuilder::methods`).
    pub fn locks_method(&self, method: &str) -> bool {
        self.shared.config.methods.locks(method)
    }

    pub(crate) fn reject(
        &self,
        kind: RejectionKind,
        detail: String,
        retry: Option<Duration>,
    ) -> Rejection {
        self.shared.metrics.rejected(kind);
        tracing::debug!(
            reason = kind.as_str(),
            status = kind.status().as_u16(),
            "request rejected"
        );
        Rejection::new(kind, detail, retry)
    }

    /// The response for `rejection`: to a gRPC call (content type `application/grpc`), a
    /// gRPC status (`grpc-status`, `grpc-message`, the retry hint in `retry-after` and
    /// `grpc-retry-pushback-ms`; see the mapping in [`reject`](crate::reject#grpc-calls));
    /// otherwise the user's hook if one is set, else [`Rejection::into_response`].
    pub fn respond(&self, rejection: Rejection, req: &dyn RequestView) -> http::Response<Bytes> {
        let rejection = rejection
            .with_type_base(self.shared.config.problem_type_base.clone())
            .with_instance(req.path());
        let mut res = if crate::grpc::is_grpc(req) {
            crate::grpc::response(&rejection)
        } else {
            match &self.shared.config.on_reject {
                Some(hook) => hook(rejection),
                None => rejection.into_response(),
            }
        };
        // A rejection means the request did not run: an idempotency layer outside this
        // one must not store it for replay.
        res.extensions_mut().insert(NotStored);
        res
    }

    /// When leases are released.
    pub fn release_point(&self) -> ReleasePoint {
        self.shared.config.release
    }

    /// Whether the locker can key requests that carry no `http` extensions
    /// ([`RequestView::extensions`] is `None`, as under actix-web):
    /// [`ConfigError::NeedsExtensions`] when its key reads a [`Principal`](crate::key::Principal)
    /// from them (its kind says so), for a framework integration to refuse when its
    /// middleware is made. A key that cannot tell (a closure) is left to the request: a
    /// `500` naming the cause in the log.
    pub fn check_without_extensions(&self) -> Result<(), ConfigError> {
        let extractor = &self.shared.config.extractor;
        if crate::key::kind::reads_principal(extractor.kind()) {
            return Err(ConfigError::NeedsExtensions(extractor.kind().to_owned()));
        }
        Ok(())
    }

    /// The locker's counters and histograms.
    pub fn metrics(&self) -> LockMetrics {
        self.shared.metrics.clone()
    }

    /// The engine the locker locks on.
    pub fn engine(&self) -> &LockEngine {
        &self.shared.engine
    }

    /// Lock `key` as [`lock`](Self::lock) does, unless a record is stored under it:
    /// `Err(record)`, and nothing is held.
    #[cfg(feature = "idempotency")]
    pub(super) async fn lock_or_record(self, key: LockKey) -> Result<Outcome, Record> {
        let started = Instant::now();
        let lock = self.lock_handle(&self.shared.engine, &key, self.shared.config.wait, None);
        let result = match lock.acquire_or_record().await {
            Ok(Acquired::Record(record)) => return Err(record),
            Ok(Acquired::Lease(lease)) => Ok(lease),
            Err(error) => Err(error),
        };
        Ok(self.settle(result, &key, Mode::Exclusive, Some(started)))
    }

    /// The backend failed outside an acquisition (idempotency replay's record read): the
    /// same outage log as a failed acquisition.
    #[cfg(feature = "idempotency")]
    pub(super) fn backend_failed(&self, error: &LockError) {
        if let LockError::Backend(error) = error {
            let c = &self.shared.config;
            self.shared.outage.failed(&c.name, error, c.backend_failure);
        }
    }

    /// The backend answered outside an acquisition: ends a logged outage.
    #[cfg(feature = "idempotency")]
    pub(super) fn backend_ok(&self) {
        self.shared.outage.answered(&self.shared.config.name);
    }

    #[cfg(feature = "idempotency")]
    pub(super) fn retry_after_fallback(&self) -> Duration {
        self.shared.config.retry_after_fallback
    }
}
