//! [`RequestLocker`]: the layer's configuration and shared state, and the steps from a
//! request to an [`Outcome`].

use std::{
    fmt,
    sync::Arc,
    task::{Context, Poll, Waker},
    time::Duration,
};

use bytes::Bytes;
use tokio::time::Instant;
use tracing::Instrument;

use super::{LockGuard, Outcome, outage::OutageLog};
use crate::{
    engine::{BoxFuture, KeyError, Lease, Lock, LockEngine, LockError, LockKey, LockOptions},
    key::{KeyExtractor, RequestView},
    lease_info::LeaseInfo,
    metrics::LockMetrics,
    options::{BackendFailurePolicy, MissingKeyPolicy, ReleasePoint},
    reject::{Rejection, RejectionKind},
    retry_after,
};

/// Builds a custom response for a rejection. Receives the typed rejection, with its
/// headers already filled in; [`Rejection::into_response`] is the default.
pub(crate) type RejectHook = Arc<dyn Fn(Rejection) -> http::Response<Bytes> + Send + Sync>;

pub(crate) struct Config {
    pub(crate) extractor: Arc<dyn KeyExtractor>,
    /// The layer's namespace, possibly empty.
    pub(crate) namespace: String,
    /// `<namespace>/<kind>/`, escaped ([`crate::key::encode`]): every lock key of the
    /// layer is this followed by an extracted value.
    pub(crate) key_head: String,
    pub(crate) missing: MissingKeyPolicy,
    /// The lease TTL, FIFO mode and waiter limit each lock is taken with (and the wait,
    /// also in `wait`).
    pub(crate) options: LockOptions,
    /// How long a request waits for a held key: zero answers at once.
    pub(crate) wait: Duration,
    /// The answer to a held key when not waiting: `Locked` (423) or, for the idempotency
    /// preset, `Conflict` (409).
    pub(crate) busy: RejectionKind,
    pub(crate) backend_failure: BackendFailurePolicy,
    pub(crate) release: ReleasePoint,
    pub(crate) retry_after_fallback: Duration,
    pub(crate) on_reject: Option<RejectHook>,
    /// The methods that take a lock (`None`: every method).
    pub(crate) methods: Option<Box<[Box<str>]>>,
    /// The base of problem `type` URIs (`None`: the `urn:tower-lock:problem:` URNs).
    pub(crate) problem_type_base: Option<Arc<str>>,
    /// The layer's name: the `layer` label of its metrics and a field of its outage logs.
    pub(crate) name: String,
}

struct Shared {
    config: Config,
    engine: LockEngine,
    /// The in-process engine of the degrade policy, created with the locker so that every
    /// service built from one layer shares it.
    local: Option<LockEngine>,
    metrics: LockMetrics,
    outage: OutageLog,
}

/// The runtime core of a layer, shared by the tower [`LockLayer`](crate::LockLayer) and
/// framework integrations: key extraction, contention and failure handling, and the shared
/// state they act on (the engine, the in-process fallback engine, the metrics). Cheap to
/// clone; clones share one lock table and one set of metrics.
///
/// Built by [`LockLayerBuilder::build_locker`](crate::LockLayerBuilder::build_locker), or
/// taken from a layer with [`LockLayer::locker`](crate::LockLayer::locker).
#[derive(Clone)]
pub struct RequestLocker {
    shared: Arc<Shared>,
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
            .finish_non_exhaustive()
    }
}

/// The first step of an acquisition: decided at once, or a future to wait for.
pub(crate) enum Start {
    Now(Outcome),
    Pending(BoxFuture<'static, Outcome>),
}

impl RequestLocker {
    pub(crate) fn new(config: Config, engine: LockEngine) -> Self {
        let local =
            (config.backend_failure == BackendFailurePolicy::Degrade).then(LockEngine::in_memory);
        let metrics = LockMetrics::new(&config.name);
        RequestLocker {
            shared: Arc::new(Shared {
                config,
                engine,
                local,
                metrics,
                outage: OutageLog::default(),
            }),
        }
    }

    /// Decide for `req`: extract its key, then acquire the key as configured. Waiting, if
    /// any, happens in the returned future, which borrows nothing from `req`; dropping it
    /// gives up the wait and leaves nothing behind.
    pub fn acquire(&self, req: &dyn RequestView) -> BoxFuture<'static, Outcome> {
        match self.start(req) {
            Start::Now(outcome) => Box::pin(std::future::ready(outcome)),
            Start::Pending(fut) => fut,
        }
    }

    /// The lock key of `req` (`<namespace>/<kind>/<value>`, see
    /// [`key`](crate::key#the-lock-key)), validated: `Ok(None)` when it has none and the
    /// missing-key policy lets it pass, a `400` rejection when it has none and the policy
    /// requires one, or when it is malformed or too long.
    pub fn key(&self, req: &dyn RequestView) -> Result<Option<LockKey>, Rejection> {
        let c = &self.shared.config;
        // Borrowed where the extractor can: the value is copied once, into the key.
        let raw = match c.extractor.extract_ref(req) {
            Ok(Some(raw)) => raw,
            Ok(None) => {
                return match c.missing {
                    MissingKeyPolicy::PassThrough => Ok(None),
                    MissingKeyPolicy::Reject => Err(self.reject(
                        RejectionKind::MissingKey,
                        "this endpoint requires a lock key (for example an Idempotency-Key or tenant header) and the request has none".to_owned(),
                        None,
                    )),
                };
            }
            Err(malformed) => {
                return Err(self.reject(
                    RejectionKind::MalformedKey,
                    malformed.reason().to_owned(),
                    None,
                ));
            }
        };
        self.lock_key(&raw).map(Some).map_err(|e| {
            self.reject(
                RejectionKind::MalformedKey,
                format!("the lock key is unusable: {e}"),
                None,
            )
        })
    }

    /// The lock key this locker takes for a request whose extractor gives `value`:
    /// `<namespace>/<kind>/<value>` (see [`key`](crate::key#the-lock-key)). Lock it on
    /// the engine to exclude the layer's requests for that value, for example from a
    /// background job.
    ///
    /// ```
    /// use http::HeaderName;
    /// use tower_lock::{LockEngine, LockLayer, key::HeaderKey};
    ///
    /// let layer = LockLayer::builder(LockEngine::in_memory())
    ///     .namespace("billing")
    ///     .key(HeaderKey::new(HeaderName::from_static("x-tenant-id")))
    ///     .build()
    ///     .unwrap();
    /// let key = layer.locker().lock_key("acme").unwrap();
    /// assert_eq!(key.as_str(), "billing/header=x-tenant-id/acme");
    /// ```
    pub fn lock_key(&self, value: &str) -> Result<LockKey, KeyError> {
        // Built in place: one allocation per request, not a `String` and then its copy.
        LockKey::joined(&self.shared.config.key_head, value)
    }

    /// The layer's namespace (empty unless set with
    /// [`namespace`](crate::LockLayerBuilder::namespace)).
    pub fn namespace(&self) -> &str {
        &self.shared.config.namespace
    }

    /// Whether requests with `method` take a lock ([`LockLayerBuilder::methods`]).
    ///
    /// [`LockLayerBuilder::methods`]: crate::LockLayerBuilder::methods
    pub fn locks_method(&self, method: &str) -> bool {
        self.shared
            .config
            .methods
            .as_ref()
            .is_none_or(|methods| methods.iter().any(|m| &**m == method))
    }

    pub(crate) fn start(&self, req: &dyn RequestView) -> Start {
        if !self.locks_method(req.method()) {
            return Start::Now(Outcome::Unlocked);
        }
        match self.key(req) {
            Err(rejection) => Start::Now(Outcome::Rejected(rejection)),
            Ok(None) => {
                tracing::debug!("no lock key; running unlocked");
                self.shared.metrics.unlocked();
                Start::Now(Outcome::Unlocked)
            }
            Ok(Some(key)) => {
                // A free key on the in-process engine is granted right here, with no future
                // (boxed or not): the request goes straight to the inner service. Not under
                // the degrade policy, which takes two locks in turn.
                if self.shared.local.is_none() {
                    let started = Instant::now();
                    let lock = self.lock_handle(&self.shared.engine, &key, self.shared.config.wait);
                    if let Some(result) = lock.acquire_now() {
                        let _span = tracing::debug_span!("tower_lock.acquire", %key).entered();
                        return Start::Now(self.settle(result, started));
                    }
                }
                // It must wait (or the backend answers over the network): one boxed future,
                // polled once here, so that a waiter takes its place in the queue (and a
                // network request is sent) when the request is called, not when its future
                // is first polled: FIFO order is the order of calls.
                let span = tracing::debug_span!("tower_lock.acquire", %key);
                let metrics = self.shared.metrics.clone();
                let lock = self.clone().lock(key);
                let mut acquire: BoxFuture<'static, Outcome> = Box::pin(
                    async move {
                        let mut lock = std::pin::pin!(lock);
                        // Counted as waiting from a first poll that did not decide, until
                        // the acquisition ends or is given up (this future is dropped).
                        let mut waiting = None;
                        std::future::poll_fn(|cx| {
                            let poll = lock.as_mut().poll(cx);
                            if poll.is_pending() && waiting.is_none() {
                                waiting = Some(metrics.waiting());
                            }
                            poll
                        })
                        .await
                    }
                    .instrument(span),
                );
                let mut cx = Context::from_waker(Waker::noop());
                match acquire.as_mut().poll(&mut cx) {
                    Poll::Ready(outcome) => Start::Now(outcome),
                    Poll::Pending => Start::Pending(acquire),
                }
            }
        }
    }

    pub(crate) async fn lock(self, key: LockKey) -> Outcome {
        let started = Instant::now();
        if let Some(local) = &self.shared.local {
            return self.lock_degradable(local, key, started).await;
        }
        let result = self
            .lock_on(&self.shared.engine, &key, self.shared.config.wait)
            .await;
        self.settle(result, started)
    }

    /// The outcome of an acquisition on the engine (not under the degrade policy).
    fn settle(&self, result: Result<Lease, LockError>, started: Instant) -> Outcome {
        let c = &self.shared.config;
        self.backend_answered(&result);
        match result {
            Ok(lease) => self.held(lease, None, started, false),
            Err(LockError::Backend(error)) => match c.backend_failure {
                // (A degrading locker locks in `lock_degradable`.)
                BackendFailurePolicy::FailClosed | BackendFailurePolicy::Degrade => {
                    self.shared
                        .outage
                        .failed(&c.name, &error, BackendFailurePolicy::FailClosed);
                    Outcome::Rejected(self.reject(
                        RejectionKind::BackendUnavailable,
                        "the lock service is unavailable".to_owned(),
                        Some(c.retry_after_fallback),
                    ))
                }
                BackendFailurePolicy::FailOpen => {
                    self.shared
                        .outage
                        .failed(&c.name, &error, BackendFailurePolicy::FailOpen);
                    self.shared.metrics.unlocked();
                    Outcome::Unlocked
                }
            },
            Err(e) => self.refuse(e),
        }
    }

    /// The degrade policy: the node-local lock first, then the backend's. The node-local
    /// lease is kept for the whole request, so the node stays serialized per key even
    /// when the backend stalls while some requests hold its lock and others fall back.
    async fn lock_degradable(&self, local: &LockEngine, key: LockKey, started: Instant) -> Outcome {
        let c = &self.shared.config;
        let node = match self.lock_on(local, &key, c.wait).await {
            Ok(lease) => lease,
            Err(e) => return self.refuse(e),
        };
        // What is left of the wait; a waiting layer keeps waiting (and answers 429, not
        // 423, when nothing is left).
        let wait = if c.wait.is_zero() {
            Duration::ZERO
        } else {
            c.wait
                .saturating_sub(started.elapsed())
                .max(Duration::from_millis(1))
        };
        let result = self.lock_on(&self.shared.engine, &key, wait).await;
        self.backend_answered(&result);
        match result {
            Ok(lease) => self.held(lease, Some(node), started, false),
            Err(LockError::Backend(error)) => {
                self.shared
                    .outage
                    .failed(&c.name, &error, BackendFailurePolicy::Degrade);
                self.shared.metrics.degraded();
                self.held(node, None, started, true)
            }
            Err(e) => self.refuse(e),
        }
    }

    /// The backend failed outside an acquisition (idempotency replay's record read): the
    /// same outage log as a failed acquisition.
    pub(crate) fn backend_failed(&self, error: &LockError) {
        if let LockError::Backend(error) = error {
            let c = &self.shared.config;
            self.shared.outage.failed(&c.name, error, c.backend_failure);
        }
    }

    /// The backend answered outside an acquisition: ends a logged outage.
    pub(crate) fn backend_ok(&self) {
        self.shared.outage.answered(&self.shared.config.name);
    }

    /// Ends an outage, if one was logged, when the backend answered (anything but a
    /// backend failure is an answer: a grant, a refusal, a wait that ran out).
    fn backend_answered(&self, result: &Result<Lease, LockError>) {
        if !matches!(result, Err(LockError::Backend(_))) {
            self.shared.outage.answered(&self.shared.config.name);
        }
    }

    async fn lock_on(
        &self,
        engine: &LockEngine,
        key: &LockKey,
        wait: Duration,
    ) -> Result<Lease, LockError> {
        self.lock_handle(engine, key, wait).acquire().await
    }

    /// The lock this locker takes on `key`, waiting up to `wait` (zero: not at all).
    fn lock_handle(&self, engine: &LockEngine, key: &LockKey, wait: Duration) -> Lock {
        // Option by option, not `Lock::options`: what the layer does not set (auto-renewal,
        // a waiter limit when it has none) stays the engine's default.
        let options = &self.shared.config.options;
        let lock = engine
            .lock_key(key.clone())
            .ttl(options.lease_ttl())
            .fifo(options.is_fifo())
            .wait(wait);
        match options.waiter_limit() {
            Some(max) => lock.max_waiters(max),
            None => lock,
        }
    }

    fn held(&self, lease: Lease, node: Option<Lease>, started: Instant, degraded: bool) -> Outcome {
        let now = Instant::now();
        let waited = now.saturating_duration_since(started);
        // A non-waiting acquire that succeeded found the key free. A waiting one: the
        // engine cannot say whether it queued, so a grant that took a millisecond or more
        // is counted as contended.
        let contended = !self.shared.config.wait.is_zero() && waited >= Duration::from_millis(1);
        self.shared.metrics.acquired(waited, contended);
        if contended {
            tracing::debug!(
                fence = lease.fence().get(),
                ?waited,
                degraded,
                "lock acquired after waiting"
            );
        } else {
            tracing::debug!(fence = lease.fence().get(), degraded, "lock acquired");
        }
        let info = LeaseInfo::new(
            lease.key().clone(),
            lease.fence(),
            waited,
            lease.lost_signal(),
            degraded,
        );
        Outcome::Locked(LockGuard::new(
            lease,
            node,
            info,
            now,
            self.shared.metrics.clone(),
        ))
    }

    fn refuse(&self, error: LockError) -> Outcome {
        let c = &self.shared.config;
        // What this layer has seen of hold times, bounded by the holder's remaining lease.
        let retry = retry_after::contended(
            self.shared.metrics.recent_hold(),
            error.retry_after(),
            c.retry_after_fallback,
        );
        let (kind, detail) = match &error {
            LockError::Busy { .. } if c.busy == RejectionKind::Conflict => (
                RejectionKind::Conflict,
                "a request with the same idempotency key is still being processed".to_owned(),
            ),
            LockError::Busy { .. } => (
                RejectionKind::Locked,
                "another request holds the lock for this resource".to_owned(),
            ),
            LockError::TimedOut { waited, .. } => (
                RejectionKind::TimedOut,
                format!(
                    "waited {} ms for the lock without getting it",
                    waited.as_millis()
                ),
            ),
            LockError::QueueFull { .. } => (
                RejectionKind::QueueFull,
                "too many requests are already waiting for this lock".to_owned(),
            ),
            LockError::InvalidKey(e) => {
                return Outcome::Rejected(self.reject(
                    RejectionKind::MalformedKey,
                    format!("the lock key is unusable: {e}"),
                    None,
                ));
            }
            other => {
                tracing::error!(error = %other, "lock acquisition failed");
                return Outcome::Rejected(self.reject(
                    RejectionKind::BackendUnavailable,
                    "the lock service is unavailable".to_owned(),
                    Some(c.retry_after_fallback),
                ));
            }
        };
        Outcome::Rejected(self.reject(kind, detail, Some(retry)))
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

    /// The response for `rejection`: the user's hook if one is set, else
    /// [`Rejection::into_response`].
    pub fn respond(&self, rejection: Rejection, req: &dyn RequestView) -> http::Response<Bytes> {
        let rejection = rejection
            .with_type_base(self.shared.config.problem_type_base.clone())
            .with_instance(req.path());
        let mut res = match &self.shared.config.on_reject {
            Some(hook) => hook(rejection),
            None => rejection.into_response(),
        };
        // A rejection means the request did not run: an idempotency layer outside this
        // one must not store it for replay.
        res.extensions_mut().insert(crate::idempotency::NotStored);
        res
    }

    pub(crate) fn retry_after_fallback(&self) -> Duration {
        self.shared.config.retry_after_fallback
    }

    /// When leases are released.
    pub fn release_point(&self) -> ReleasePoint {
        self.shared.config.release
    }

    /// The locker's counters and histograms.
    pub fn metrics(&self) -> LockMetrics {
        self.shared.metrics.clone()
    }

    /// The engine the locker locks on.
    pub fn engine(&self) -> &LockEngine {
        &self.shared.engine
    }
}
