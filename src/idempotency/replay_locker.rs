//! [`ReplayLocker`]: the framework-neutral core of idempotency replay, from a request's
//! key and fingerprint to "replay this", "refuse this" or "run it, then complete".

use std::{fmt, future::Future, pin::Pin, sync::Arc, time::Duration};

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};

use super::{
    fingerprint::{FingerprintFn, Hasher},
    stored::{self, Stored},
};
use crate::{
    engine::{LockError, LockKey, Record, background::Finish},
    integration::{LockGuard, Outcome, RequestLocker},
    key::RequestView,
    lease_info::LeaseInfo,
    options::BackendFailurePolicy,
    reject::{Rejection, RejectionKind},
};

/// The replay options, as the builder checked them.
pub(crate) struct ReplayOptions {
    pub(crate) replayed_header: HeaderName,
    pub(crate) store_server_errors: bool,
    pub(crate) max_response_body: usize,
    pub(crate) max_response_headers: usize,
    pub(crate) max_request_body: usize,
    pub(crate) retention: Duration,
    pub(crate) fingerprint_headers: Vec<HeaderName>,
    pub(crate) fingerprint: Option<FingerprintFn>,
}

struct Shared {
    locker: RequestLocker,
    options: ReplayOptions,
}

/// The runtime core of an [`IdempotencyLayer`](super::IdempotencyLayer), shared with
/// framework integrations: which requests it covers, their fingerprints, and the decision
/// for each (replay, refuse, or run and complete). Cheap to clone.
///
/// The steps for one request: [`key`](Self::key) (before the body is read), the whole
/// body through [`fingerprint`](Self::fingerprint) (at most
/// [`max_request_body`](Self::max_request_body) bytes), then [`begin`](Self::begin). A
/// [`Begin::Run`] carries the [`Completion`] the response is captured into.
#[derive(Clone)]
pub struct ReplayLocker {
    shared: Arc<Shared>,
}

impl fmt::Debug for ReplayLocker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let o = &self.shared.options;
        f.debug_struct("ReplayLocker")
            .field("locker", &self.shared.locker)
            .field("retention", &o.retention)
            .field("max_request_body", &o.max_request_body)
            .field("max_response_body", &o.max_response_body)
            .field("max_response_headers", &o.max_response_headers)
            .field("store_server_errors", &o.store_server_errors)
            .finish_non_exhaustive()
    }
}

/// What [`ReplayLocker::begin`] decided for a request.
#[derive(Debug)]
pub enum Begin {
    /// Run the handler holding the key; capture its response into the [`Completion`].
    Run(Completion),
    /// Run the handler without a lock and store nothing (the backend failed under the
    /// fail-open policy).
    Unlocked,
    /// Answer with this stored response (its `Idempotent-Replayed` header included).
    Replay(http::Response<Bytes>),
    /// Answer with this rejection (see [`ReplayLocker::respond`]).
    Rejected(Rejection),
}

impl ReplayLocker {
    pub(crate) fn new(locker: RequestLocker, options: ReplayOptions) -> Self {
        ReplayLocker {
            shared: Arc::new(Shared { locker, options }),
        }
    }

    /// The lock core underneath: key extraction, waiting, rejections, metrics.
    pub fn locker(&self) -> &RequestLocker {
        &self.shared.locker
    }

    /// The key of `req`, before its body is read: `Ok(None)` when the request passes
    /// through untouched (a method the layer does not cover, or no key under the
    /// pass-through policy), a `400` rejection for a missing or malformed key.
    pub fn key(&self, req: &dyn RequestView) -> Result<Option<LockKey>, Rejection> {
        let locker = &self.shared.locker;
        if !locker.locks_method(req.method()) {
            return Ok(None);
        }
        let key = locker.key(req)?;
        if key.is_none() {
            locker.metrics().unlocked();
        }
        Ok(key)
    }

    /// The largest request body the layer reads (and fingerprints); a larger one is
    /// answered with [`too_large`](Self::too_large).
    pub fn max_request_body(&self) -> usize {
        self.shared.options.max_request_body
    }

    /// The fingerprint of `req` with this whole `body` (see
    /// [`IdempotencyLayerBuilder::fingerprint_with`](super::IdempotencyLayerBuilder::fingerprint_with)
    /// for what the default covers).
    pub fn fingerprint(&self, req: &dyn RequestView, body: &[u8]) -> Bytes {
        let mut f = self.fingerprinter(req);
        f.update(body);
        f.finish(req, body)
    }

    /// A fingerprint fed chunk by chunk as the body streams in.
    pub(crate) fn fingerprinter(&self, req: &dyn RequestView) -> Fingerprinter {
        let o = &self.shared.options;
        match &o.fingerprint {
            Some(f) => Fingerprinter::Custom(f.clone()),
            None => Fingerprinter::Sha256(Hasher::new(req, &o.fingerprint_headers)),
        }
    }

    /// The `413` rejection for a request body over [`max_request_body`](Self::max_request_body).
    pub fn too_large(&self) -> Rejection {
        self.shared.locker.reject(
            RejectionKind::RequestTooLarge,
            format!(
                "an idempotent request body may be at most {} bytes",
                self.max_request_body()
            ),
            None,
        )
    }

    /// The `400` rejection for a request body that failed before its end.
    pub fn unreadable(&self) -> Rejection {
        self.shared.locker.reject(
            RejectionKind::UnreadableBody,
            "the request body ended with an error before it was complete".to_owned(),
            None,
        )
    }

    /// The response for `rejection` (see [`RequestLocker::respond`]).
    pub fn respond(&self, rejection: Rejection, req: &dyn RequestView) -> http::Response<Bytes> {
        self.shared.locker.respond(rejection, req)
    }

    /// Decide for the request with `key` and `fingerprint`: a completed record is
    /// replayed (or refused `422` when the fingerprint differs) without taking the lock;
    /// otherwise the key is locked as the layer is configured (`409` for a duplicate in
    /// flight, or a wait), and checked again once held, because the request that held it
    /// before may have completed meanwhile. Records are written only together with the
    /// release of the lock that guarded them, so that second look, made while holding
    /// the key, is final.
    ///
    /// The returned future borrows nothing; dropping it gives up the wait.
    pub fn begin(
        &self,
        key: LockKey,
        fingerprint: Bytes,
    ) -> impl Future<Output = Begin> + Send + 'static {
        let this = self.clone();
        async move { this.decide(key, fingerprint).await }
    }

    async fn decide(self, key: LockKey, fingerprint: Bytes) -> Begin {
        let locker = &self.shared.locker;
        let engine = locker.engine().clone();
        // Most retries find a completed record: answered in one read, without the lock.
        let first = engine.record(&key).await;
        if first.is_ok() {
            locker.backend_ok();
        }
        match first {
            Ok(Some(record)) => return self.answer(record, &fingerprint),
            Ok(None) => {}
            Err(error) => {
                if let Some(begin) = self.read_failed(error) {
                    return begin;
                }
            }
        }
        let guard = match locker.clone().lock(key.clone()).await {
            Outcome::Locked(guard) => guard,
            Outcome::Unlocked => return Begin::Unlocked,
            Outcome::Rejected(rejection) => return Begin::Rejected(rejection),
        };
        if guard.info().is_degraded() {
            // The backend is down and only this node's lock is held: nothing can be
            // read or stored. Run, as the degrade policy says, and keep nothing.
            return Begin::Run(Completion::new(
                guard,
                fingerprint,
                self.shared.clone(),
                false,
            ));
        }
        match engine.record(&key).await {
            Ok(None) => Begin::Run(Completion::new(
                guard,
                fingerprint,
                self.shared.clone(),
                true,
            )),
            Ok(Some(record)) => {
                guard.release_now();
                self.answer(record, &fingerprint)
            }
            Err(error) => {
                guard.release_now();
                self.read_failed(error)
                    .unwrap_or_else(|| self.unavailable())
            }
        }
    }

    /// A record read failed: `None` to go on to the lock (degrade), else the answer.
    fn read_failed(&self, error: LockError) -> Option<Begin> {
        let locker = &self.shared.locker;
        if locker.backend_failure() != BackendFailurePolicy::Degrade {
            // Logged as the lock's own failures are: once at the transition, then in
            // periodic summaries. (Degrading, the acquisition that follows logs it.)
            locker.backend_failed(&error);
        }
        match locker.backend_failure() {
            BackendFailurePolicy::Degrade => {
                tracing::debug!(%error, "reading the idempotency record failed; degrading");
                None
            }
            BackendFailurePolicy::FailOpen => {
                tracing::debug!(%error, "reading the idempotency record failed; running unlocked");
                self.shared.locker.metrics().unlocked();
                Some(Begin::Unlocked)
            }
            BackendFailurePolicy::FailClosed => {
                tracing::debug!(%error, "reading the idempotency record failed; rejecting");
                Some(self.unavailable())
            }
        }
    }

    fn unavailable(&self) -> Begin {
        let locker = &self.shared.locker;
        Begin::Rejected(locker.reject(
            RejectionKind::BackendUnavailable,
            "the lock service is unavailable".to_owned(),
            Some(locker.retry_after_fallback()),
        ))
    }

    fn answer(&self, record: Record, fingerprint: &Bytes) -> Begin {
        let locker = &self.shared.locker;
        if record.fingerprint != *fingerprint {
            return Begin::Rejected(locker.reject(
                RejectionKind::FingerprintMismatch,
                "this idempotency key was already used with a different request (method, path, query, content type, fingerprinted headers or body)".to_owned(),
                None,
            ));
        }
        if !record.kept {
            // A tombstone: the request completed, but the store could not keep its
            // response (the in-process record budget). Never run again; no status to tell.
            return Begin::Rejected(locker.reject(
                RejectionKind::NotReplayable,
                "the request with this idempotency key completed, but its response could not be kept, so it cannot be replayed".to_owned(),
                None,
            ));
        }
        match stored::decode(&record.meta) {
            Some(Stored::Response { status, headers }) => {
                locker.metrics().replayed();
                let mut res = http::Response::new(record.body);
                *res.status_mut() = status;
                *res.headers_mut() = headers;
                res.headers_mut().insert(
                    self.shared.options.replayed_header.clone(),
                    HeaderValue::from_static("true"),
                );
                Begin::Replay(res)
            }
            Some(Stored::NotKept { status }) => Begin::Rejected(
                locker
                    .reject(
                        RejectionKind::NotReplayable,
                        format!(
                            "the request with this idempotency key completed with status {status}, but its response was too large to keep, so it cannot be replayed"
                        ),
                        None,
                    )
                    .with_original_status(status),
            ),
            None => {
                tracing::warn!("unreadable idempotency record; not served");
                self.unavailable()
            }
        }
    }
}

/// The default or the user's fingerprint, fed while the body streams in.
pub(crate) enum Fingerprinter {
    Sha256(Hasher),
    Custom(FingerprintFn),
}

impl Fingerprinter {
    pub(crate) fn update(&mut self, chunk: &[u8]) {
        if let Fingerprinter::Sha256(h) = self {
            h.update(chunk);
        }
    }

    pub(crate) fn finish(self, req: &dyn RequestView, body: &[u8]) -> Bytes {
        match self {
            Fingerprinter::Sha256(h) => h.finish(),
            Fingerprinter::Custom(f) => f(req, body),
        }
    }
}

/// A request running under its key: turn its response into a [`Capture`] with
/// [`capture`](Self::capture). Dropping it (the handler failed or panicked) releases the
/// key and stores nothing, so a retry runs again.
pub struct Completion {
    guard: LockGuard,
    fingerprint: Bytes,
    shared: Arc<Shared>,
    /// `false` when nothing can be stored (a degraded, node-local lock).
    store: bool,
}

impl fmt::Debug for Completion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Completion")
            .field("lease", self.guard.info())
            .finish_non_exhaustive()
    }
}

impl Completion {
    fn new(guard: LockGuard, fingerprint: Bytes, shared: Arc<Shared>, store: bool) -> Self {
        Completion {
            guard,
            fingerprint,
            shared,
            store,
        }
    }

    /// The lease the request runs under.
    pub fn info(&self) -> &LeaseInfo {
        self.guard.info()
    }

    /// Start capturing the response with this status and headers. Responses with a
    /// status that is not kept (`5xx` unless the layer stores server errors, `408`,
    /// `425`, `429`) are not captured: the key is released at the end of the body, with
    /// no record, and a retry runs again.
    pub fn capture(self, status: StatusCode, headers: &HeaderMap) -> Capture {
        let o = &self.shared.options;
        let kept_status = !matches!(status.as_u16(), 408 | 425 | 429)
            && (o.store_server_errors || !status.is_server_error());
        let state = if !self.store || !kept_status {
            State::Release
        } else {
            match stored::encode(status, headers, o.max_response_headers) {
                Some(meta) => State::Keep {
                    status,
                    meta,
                    body: BytesMut::new(),
                },
                None => State::NotKept { status },
            }
        };
        Capture {
            completion: self,
            state,
        }
    }
}

/// A response being captured for replay: feed it the body's data with
/// [`data`](Self::data), then [`finish`](Self::finish) at the end of the body. Dropping it
/// unfinished (the body failed) releases the key and stores nothing.
pub struct Capture {
    completion: Completion,
    state: State,
}

enum State {
    /// Nothing to keep: release at the end.
    Release,
    Keep {
        status: StatusCode,
        meta: Bytes,
        body: BytesMut,
    },
    /// Completed, but over a limit: keep only that it completed, and its status.
    NotKept { status: StatusCode },
}

impl fmt::Debug for Capture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Release => "release",
            State::Keep { .. } => "keep",
            State::NotKept { .. } => "not kept",
        };
        f.debug_struct("Capture")
            .field("state", &state)
            .finish_non_exhaustive()
    }
}

impl Capture {
    /// Whether more body is still worth reading for the record (`false` once nothing is
    /// kept, or the body passed the limit).
    pub fn wants_data(&self) -> bool {
        matches!(self.state, State::Keep { .. })
    }

    /// A chunk of the response body.
    pub fn data(&mut self, chunk: &[u8]) {
        if let State::Keep { status, body, .. } = &mut self.state {
            if body.len() + chunk.len() > self.completion.shared.options.max_response_body {
                self.state = State::NotKept { status: *status };
            } else {
                body.extend_from_slice(chunk);
            }
        }
    }

    /// The response has trailers: it is not kept (a replay could not reproduce them).
    pub fn trailers(&mut self) {
        if let State::Keep { status, .. } = self.state {
            self.state = State::NotKept { status };
        }
    }

    /// The body is complete: store the record and release the key, in one atomic step.
    /// Begins in this call; finishes even if the returned future is dropped. A holder
    /// whose lease ran out before this writes nothing (logged, and counted as
    /// `discarded` in the metrics).
    pub fn finish(self) -> impl Future<Output = ()> + Send + 'static {
        let Capture { completion, state } = self;
        let Completion {
            guard,
            fingerprint,
            shared,
            ..
        } = completion;
        let record = match state {
            State::Release => None,
            State::Keep { meta, body, .. } => Some(Record::new(fingerprint, meta, body.freeze())),
            State::NotKept { status } => Some(Record::new(
                fingerprint,
                stored::encode_not_kept(status),
                Bytes::new(),
            )),
        };
        let op: Pin<Box<dyn Future<Output = ()> + Send>> = match record {
            None => Box::pin(guard.release()),
            Some(record) => {
                let key = guard.info().key().clone();
                let metrics = shared.locker.metrics();
                let complete = guard.complete(record, shared.options.retention);
                Box::pin(async move {
                    match complete.await {
                        Ok(()) => {}
                        Err(LockError::NotOwned | LockError::Expired) => {
                            metrics.discarded();
                            tracing::warn!(%key, "the lease ran out before the response was stored; not stored");
                        }
                        Err(error) => {
                            tracing::warn!(%key, %error, "storing the response failed; the lease's TTL frees the key");
                        }
                    }
                })
            }
        };
        let mut finish = Finish::new(op);
        // Begin now: an in-process store completes on this first poll.
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        let done = Pin::new(&mut finish).poll(&mut cx).is_ready();
        async move {
            if !done {
                finish.await;
            }
        }
    }
}
