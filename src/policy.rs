//! The framework-neutral core of the middleware: from a request to "run it holding this
//! lease", "run it unlocked" or "answer with this rejection".
//!
//! [`LockPolicy`] holds the layer's configuration and its shared state (the engine, the
//! in-process fallback engine, the metrics). The tower [`LockLayer`](crate::LockLayer) is
//! a thin shell over it; an integration for another framework calls
//! [`LockPolicy::acquire`] with its own [`RequestView`] and maps the [`Outcome`].
//!
//! ```
//! use tower_lock::{LockEngine, LockLayer, Outcome, key::PathKey};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let layer = LockLayer::builder(LockEngine::in_memory()).key(PathKey).build().unwrap();
//! let policy = layer.policy();
//! let req = http::Request::builder().uri("/reports/7").body(()).unwrap();
//! match policy.acquire(&req).await {
//!     Outcome::Locked(held) => println!("run the handler holding {}", held.info().key()),
//!     Outcome::Unlocked => println!("run the handler without a lock"),
//!     Outcome::Rejected(rejection) => println!("answer {}", rejection.status()),
//!     _ => {}
//! }
//! # }
//! ```

use std::{
    fmt,
    sync::Arc,
    task::{Context, Waker},
    time::Duration,
};

use bytes::Bytes;
use tokio::time::Instant;
use tracing::Instrument;

use crate::{
    engine::{BoxFuture, Fence, Lease, LockEngine, LockKey, LostSignal},
    error::{KeyError, LockError},
    key::{KeyExtractor, RequestView},
    metrics::LockMetrics,
    reject::{Rejection, RejectionKind},
};

/// What to do with a request that has no lock key.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum MissingKeyPolicy {
    /// Answer `400 Bad Request`, explaining which key is missing (the default: a request
    /// that silently runs unprotected is the surprise to avoid).
    #[default]
    Reject,
    /// Run the request without a lock.
    PassThrough,
}

/// What to do when the lock backend fails (unreachable, timed out).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum BackendFailurePolicy {
    /// Answer `503 Service Unavailable` with `Retry-After` (the default).
    #[default]
    FailClosed,
    /// Run the request without a lock, logging a warning.
    FailOpen,
    /// Lock on an in-process engine instead: requests are still serialized per key on
    /// this node, not across the fleet. Logged as a warning, and visible to handlers as
    /// [`LeaseInfo::is_degraded`]: the in-process engine's fencing tokens are not
    /// comparable with the backend's, so storage that checks fences should not accept
    /// them as if they were.
    ///
    /// Under this policy every request takes the node-local lock first and the backend's
    /// second (keeping both), so the node-local lock alone serializes the node whatever
    /// the backend does: a request that holds a key on the backend excludes one that
    /// falls back while the backend stalls, and a degraded request excludes one that finds
    /// the backend back. Across nodes, only the backend's lock excludes: during an outage,
    /// two nodes may each run a request for one key. Every request tries the backend, so
    /// during an outage each pays the backend's timeout before falling back.
    Degrade,
}

/// When the lease of a request is released.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReleasePoint {
    /// When the response body has been fully sent, or dropped (the default): a streamed
    /// response keeps its key until the last chunk. A response with no body to send (`204`,
    /// `304`, any answer to `HEAD`, an empty body) is released before its head is handed to
    /// the server, the release completed, so a client's next request never meets its own
    /// previous lease.
    #[default]
    BodyEnd,
    /// As soon as the inner service's response future completes, before the body is sent.
    ResponseReady,
}

impl ReleasePoint {
    /// Whether a response with this status code releases the key as it is returned rather
    /// than at the end of its body: under [`ReleasePoint::ResponseReady`], and always for
    /// `101 Switching Protocols` (an upgraded connection outlives its response and is not
    /// covered by the lock).
    pub fn releases_with_response(self, status: u16) -> bool {
        self == ReleasePoint::ResponseReady || status == 101
    }

    /// Whether a response with this status is released before it is handed to the server,
    /// with the release completed rather than only begun ([`HeldLock::release`]): under
    /// [`ReleasePoint::BodyEnd`], a response with no body to send. A server never polls
    /// such a body, so its end would come only after the client has the response, and the
    /// client's next request could meet its own lease.
    ///
    /// `1xx`, `204 No Content` and `304 Not Modified` never carry a body; `no_body` says
    /// whether this response carries none for a reason its status does not show: it
    /// answers a `HEAD` request, or its body is known to be empty.
    pub fn releases_before_response(self, status: u16, no_body: bool) -> bool {
        !self.releases_with_response(status)
            && (no_body || (100..200).contains(&status) || status == 204 || status == 304)
    }
}

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
    pub(crate) ttl: Duration,
    pub(crate) wait: Duration,
    pub(crate) fifo: bool,
    pub(crate) max_waiters: Option<usize>,
    /// The answer to a held key when not waiting: `Locked` (423) or, for the idempotency
    /// preset, `Conflict` (409).
    pub(crate) busy: RejectionKind,
    pub(crate) backend_failure: BackendFailurePolicy,
    pub(crate) release: ReleasePoint,
    pub(crate) retry_after_fallback: Duration,
    pub(crate) on_reject: Option<RejectHook>,
}

struct Shared {
    config: Config,
    engine: LockEngine,
    /// The in-process engine of the degrade policy, created with the policy so that every
    /// service built from one layer shares it.
    local: Option<LockEngine>,
    metrics: LockMetrics,
}

/// The lock policy of a layer: key extraction, contention and failure handling, and the
/// shared state they act on. Cheap to clone; clones share one lock table and one set of
/// metrics.
#[derive(Clone)]
pub struct LockPolicy {
    shared: Arc<Shared>,
}

impl fmt::Debug for LockPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.shared.config;
        f.debug_struct("LockPolicy")
            .field("namespace", &c.namespace)
            .field("kind", &c.extractor.kind())
            .field("missing", &c.missing)
            .field("ttl", &c.ttl)
            .field("wait", &c.wait)
            .field("fifo", &c.fifo)
            .field("max_waiters", &c.max_waiters)
            .field("backend_failure", &c.backend_failure)
            .field("release", &c.release)
            .finish_non_exhaustive()
    }
}

/// What the policy decided for a request.
#[derive(Debug)]
#[non_exhaustive]
pub enum Outcome {
    /// Run the request holding this lease; drop it when the response is done.
    Locked(HeldLock),
    /// Run the request without a lock (no key under the pass-through policy, or the
    /// backend failed under the fail-open policy).
    Unlocked,
    /// Answer with this rejection instead of running the request.
    Rejected(Rejection),
}

/// The first step of an acquisition: decided at once, or a future to wait for.
pub(crate) enum Start {
    Now(Outcome),
    Pending(BoxFuture<'static, Outcome>),
}

impl LockPolicy {
    pub(crate) fn new(config: Config, engine: LockEngine) -> Self {
        let local =
            (config.backend_failure == BackendFailurePolicy::Degrade).then(LockEngine::in_memory);
        LockPolicy {
            shared: Arc::new(Shared {
                config,
                engine,
                local,
                metrics: LockMetrics::default(),
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
    /// policy lets it pass, a `400` rejection when it has none and the policy requires
    /// one, or when it is malformed or too long.
    pub fn key(&self, req: &dyn RequestView) -> Result<Option<LockKey>, Rejection> {
        let c = &self.shared.config;
        let raw = match c.extractor.extract(req) {
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

    /// The lock key this policy takes for a request whose extractor gives `value`:
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
    /// let key = layer.policy().lock_key("acme").unwrap();
    /// assert_eq!(key.as_str(), "billing/header=x-tenant-id/acme");
    /// ```
    pub fn lock_key(&self, value: &str) -> Result<LockKey, KeyError> {
        let head = &self.shared.config.key_head;
        let mut key = String::with_capacity(head.len() + value.len());
        key.push_str(head);
        key.push_str(value);
        LockKey::new(key)
    }

    /// The layer's namespace (empty unless set with
    /// [`namespace`](crate::LockLayerBuilder::namespace)).
    pub fn namespace(&self) -> &str {
        &self.shared.config.namespace
    }

    pub(crate) fn start(&self, req: &dyn RequestView) -> Start {
        match self.key(req) {
            Err(rejection) => Start::Now(Outcome::Rejected(rejection)),
            Ok(None) => {
                tracing::debug!("no lock key; running unlocked");
                self.shared.metrics.unlocked();
                Start::Now(Outcome::Unlocked)
            }
            Ok(Some(key)) => {
                let span = tracing::debug_span!("tower_lock.acquire", %key);
                let mut acquire: BoxFuture<'static, Outcome> =
                    Box::pin(self.clone().lock(key).instrument(span));
                // A free key on the in-process engine is granted on the first poll: then
                // the request goes straight to the inner service, with no waiting state.
                let mut cx = Context::from_waker(Waker::noop());
                match acquire.as_mut().poll(&mut cx) {
                    std::task::Poll::Ready(outcome) => Start::Now(outcome),
                    std::task::Poll::Pending => Start::Pending(acquire),
                }
            }
        }
    }

    async fn lock(self, key: LockKey) -> Outcome {
        let started = Instant::now();
        if let Some(local) = &self.shared.local {
            return self.lock_degradable(local, key, started).await;
        }
        let c = &self.shared.config;
        match self.lock_on(&self.shared.engine, &key, c.wait).await {
            Ok(lease) => self.held(lease, None, started, false),
            Err(LockError::Backend(error)) => match c.backend_failure {
                // (A degrading policy locks in `lock_degradable`.)
                BackendFailurePolicy::FailClosed | BackendFailurePolicy::Degrade => {
                    tracing::error!(%error, "lock backend failed; rejecting (fail closed)");
                    Outcome::Rejected(self.reject(
                        RejectionKind::Unavailable,
                        "the lock service is unavailable".to_owned(),
                        Some(c.retry_after_fallback),
                    ))
                }
                BackendFailurePolicy::FailOpen => {
                    tracing::warn!(%error, "lock backend failed; running unlocked (fail open)");
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
        // What is left of the wait; a waiting policy keeps waiting (and answers 429, not
        // 423, when nothing is left).
        let wait = if c.wait.is_zero() {
            Duration::ZERO
        } else {
            c.wait
                .saturating_sub(started.elapsed())
                .max(Duration::from_millis(1))
        };
        match self.lock_on(&self.shared.engine, &key, wait).await {
            Ok(lease) => self.held(lease, Some(node), started, false),
            Err(LockError::Backend(error)) => {
                tracing::warn!(
                    %error,
                    "lock backend failed; locking in-process only (degraded)"
                );
                self.shared.metrics.degraded();
                self.held(node, None, started, true)
            }
            Err(e) => self.refuse(e),
        }
    }

    async fn lock_on(
        &self,
        engine: &LockEngine,
        key: &LockKey,
        wait: Duration,
    ) -> Result<Lease, LockError> {
        let c = &self.shared.config;
        let mut lock = engine.lock_key(key.clone()).ttl(c.ttl).fifo(c.fifo);
        if let Some(max) = c.max_waiters {
            lock = lock.max_waiters(max);
        }
        if wait.is_zero() {
            lock.try_acquire().await
        } else {
            lock.wait(wait).acquire().await
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
        let info = LeaseInfo {
            key: lease.key().clone(),
            fence: lease.fence(),
            waited,
            lost: lease.lost_signal(),
            degraded,
        };
        Outcome::Locked(HeldLock {
            lease: Some(lease),
            node,
            info,
            granted: now,
            metrics: self.shared.metrics.clone(),
        })
    }

    fn refuse(&self, error: LockError) -> Outcome {
        let c = &self.shared.config;
        let retry = error.retry_after().unwrap_or(c.retry_after_fallback);
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
                (
                    RejectionKind::Unavailable,
                    "the lock service is unavailable".to_owned(),
                )
            }
        };
        Outcome::Rejected(self.reject(kind, detail, Some(retry)))
    }

    fn reject(&self, kind: RejectionKind, detail: String, retry: Option<Duration>) -> Rejection {
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
    pub fn respond(&self, rejection: Rejection) -> http::Response<Bytes> {
        match &self.shared.config.on_reject {
            Some(hook) => hook(rejection),
            None => rejection.into_response(),
        }
    }

    /// When leases are released.
    pub fn release_point(&self) -> ReleasePoint {
        self.shared.config.release
    }

    /// The policy's counters and histograms.
    pub fn metrics(&self) -> LockMetrics {
        self.shared.metrics.clone()
    }

    /// The engine the policy locks on.
    pub fn engine(&self) -> &LockEngine {
        &self.shared.engine
    }

    /// `true` if both share one lock table and one set of metrics.
    pub fn same_policy(&self, other: &LockPolicy) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }
}

/// What a handler may know about the lease it runs under; in the request extensions of
/// every locked request. Cheap to clone.
#[derive(Clone, Debug)]
pub struct LeaseInfo {
    key: LockKey,
    fence: Fence,
    waited: Duration,
    lost: LostSignal,
    degraded: bool,
}

impl LeaseInfo {
    /// The locked key: `<namespace>/<kind>/<value>` (see
    /// [`key`](crate::key#the-lock-key)).
    pub fn key(&self) -> &LockKey {
        &self.key
    }

    /// The fencing token: pass it to storage so that it refuses writes from a holder
    /// whose lease has run out.
    pub fn fence(&self) -> Fence {
        self.fence
    }

    /// How long the request waited for the lock.
    pub fn waited(&self) -> Duration {
        self.waited
    }

    /// Resolves when the lease is lost (renewal failed or the key expired): the handler
    /// is no longer protected and should stop.
    pub fn lost_signal(&self) -> LostSignal {
        self.lost.clone()
    }

    /// `true` once the lease is known to be lost.
    pub fn is_lost(&self) -> bool {
        self.lost.is_lost()
    }

    /// `true` if the lock was taken on the in-process fallback engine because the backend
    /// failed (degrade policy): it excludes only requests on this node.
    pub fn is_degraded(&self) -> bool {
        self.degraded
    }
}

/// A lease taken by a [`LockPolicy`] for one request. [`HeldLock::release`] releases the
/// key and resolves when that is done; dropping it releases in the background. Either
/// records the hold time.
pub struct HeldLock {
    lease: Option<Lease>,
    /// Under the degrade policy, the node-local lease taken before the backend's; released
    /// after it.
    node: Option<Lease>,
    info: LeaseInfo,
    granted: Instant,
    metrics: LockMetrics,
}

impl fmt::Debug for HeldLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HeldLock")
            .field("info", &self.info)
            .finish_non_exhaustive()
    }
}

impl HeldLock {
    /// What the handler may know about the lease.
    pub fn info(&self) -> &LeaseInfo {
        &self.info
    }

    /// Release the key now, without waiting for the backend: the release is started at
    /// once (an in-process engine completes it on the spot) and, if the backend needs a
    /// round trip, finished by a spawned task. Response bodies call this before handing
    /// over their last frame, so a client that has read a whole response finds the key
    /// free for its next request (on Redis, the release is on its way first).
    pub fn release_now(mut self) {
        // Dropping a lease starts its release on the spot and, if the backend needs a
        // round trip, finishes it on the engine's own runtime.
        drop(self.lease.take());
        drop(self.node.take());
    }

    /// Release the key; the returned future resolves once the backend has applied the
    /// release (or failed to: the lease's TTL then frees the key). The release begins in
    /// this call and finishes even if the future is dropped: an in-process engine
    /// completes it on the spot (the future is ready at its first poll), a backend that
    /// needs a round trip finishes it on the engine's own runtime if this future is
    /// dropped first. A response with no body to send
    /// awaits this before its head is handed to the server, which never polls that body
    /// (see [`ReleasePoint::releases_before_response`]).
    pub fn release(mut self) -> impl Future<Output = ()> + Send + 'static {
        // Both releases begin here (`Lease::release` finishes once begun, whoever waits).
        let lease = self.lease.take().map(Lease::release);
        let node = self.node.take().map(Lease::release);
        let key = self.info.key.clone();
        async move {
            for release in [lease, node].into_iter().flatten() {
                if let Err(error) = release.await {
                    tracing::debug!(%key, %error, "release did not apply");
                }
            }
        }
    }
}

impl Drop for HeldLock {
    fn drop(&mut self) {
        let held = self.granted.elapsed();
        self.metrics.held(held);
        if self.info.is_lost() {
            tracing::warn!(key = %self.info.key, ?held, "lease was lost while the request held it");
        } else {
            tracing::debug!(key = %self.info.key, ?held, "lock released");
        }
        drop(self.lease.take());
        drop(self.node.take());
    }
}
