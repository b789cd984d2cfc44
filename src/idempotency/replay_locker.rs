//! [`ReplayLocker`]: the framework-neutral core of idempotency replay, from a request's
//! key and fingerprint to "replay this", "refuse this" or "run it, then complete".

use std::{fmt, future::Future, pin::Pin, sync::Arc, time::Duration};

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};

use super::{
    fingerprint::{FingerprintFn, FingerprintKind, Hasher, canonical_json},
    scope::Scope,
    stored::{self, Stored},
};
use crate::{
    engine::{LockError, LockKey, Record, runtime::Detachable},
    integration::{LockGuard, Outcome, RequestLocker},
    key::RequestView,
    lease_info::LeaseInfo,
    reject::{Rejection, RejectionKind},
};

/// The user's say over which responses are stored (see
/// [`IdempotencyLayerBuilder::store_if`](super::IdempotencyLayerBuilder::store_if)).
pub(crate) type StoreFn = Arc<dyn Fn(StatusCode, &HeaderMap) -> bool + Send + Sync>;

/// The user's adjustment of replayed responses.
pub(crate) type ReplayHook = Arc<dyn Fn(&mut http::Response<Bytes>) + Send + Sync>;

/// The replay options, as the builder checked them.
pub(crate) struct ReplayOptions {
    pub(crate) replayed_header: HeaderName,
    pub(crate) store_server_errors: bool,
    pub(crate) max_response_body: usize,
    pub(crate) max_response_headers: usize,
    pub(crate) max_request_body: usize,
    pub(crate) retention: Duration,
    pub(crate) max_drain_time: Duration,
    pub(crate) fingerprint_headers: Vec<HeaderName>,
    pub(crate) fingerprint: FingerprintKind,
    pub(crate) store_if: Option<StoreFn>,
    pub(crate) on_replay: Option<ReplayHook>,
    pub(crate) scope: Scope,
}

impl ReplayOptions {
    /// Whether a response with this head is stored for replay. Answers that mean "this
    /// did not happen, try again" never are, whatever the user's predicate says: a
    /// replay would freeze a transient answer for the whole retention.
    fn stores(&self, status: StatusCode, headers: &HeaderMap) -> bool {
        let transient = matches!(status.as_u16(), 408 | 409 | 423 | 425 | 429 | 503)
            || (status.is_server_error() && !self.store_server_errors)
            || headers.contains_key(http::header::RETRY_AFTER);
        if transient {
            return false;
        }
        match &self.store_if {
            Some(store_if) => store_if(status, headers),
            // A request that could not be processed as sent (an extractor's `400`, `413`,
            // `415` or `422`: nothing happened, as Stripe keeps nothing when validation
            // fails), or an answer about credentials (the retry after logging in must run).
            None => !matches!(status.as_u16(), 400 | 401 | 403 | 407 | 413 | 415 | 422),
        }
    }
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
            .field("max_drain_time", &o.max_drain_time)
            .field("scope", &o.scope)
            .finish_non_exhaustive()
    }
}

/// What [`ReplayLocker::begin`] decided for a request.
#[derive(Debug)]
pub enum Begin {
    /// Run the handler holding the key; capture its response into the [`Completion`].
    Run(Completion),
    /// Run the handler without a lock and store nothing (the lock passed the request
    /// through).
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
            FingerprintKind::Custom(f) => Fingerprinter::Custom(f.clone()),
            FingerprintKind::Sha256 => {
                Fingerprinter::Sha256(Hasher::new(req, &o.fingerprint_headers))
            }
            FingerprintKind::CanonicalJson => {
                Fingerprinter::Json(Hasher::new(req, &o.fingerprint_headers))
            }
        }
    }

    /// How long the rest of a response body is read after its client left (see
    /// [`IdempotencyLayerBuilder::max_drain_time`](super::IdempotencyLayerBuilder::max_drain_time)).
    pub fn max_drain_time(&self) -> Duration {
        self.shared.options.max_drain_time
    }

    /// The lock key of the record for idempotency key `key` sent within `scope` (the
    /// value the layer's scope takes: the principal's `Display`, the extractor's value;
    /// `None` for an unscoped layer), for operators who inspect or delete one record.
    /// `None` when `scope` does not fit the layer's (a scope given to an unscoped layer,
    /// or none to a scoped one) or the key is not valid key material.
    pub fn record_key(&self, scope: Option<&str>, key: &str) -> Option<LockKey> {
        let value = self.shared.options.scope.value(scope, key)?;
        self.shared.locker.lock_key(&value).ok()
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
        match engine.record(&key).await {
            Ok(Some(record)) => {
                locker.backend_ok();
                return self.answer(record, &fingerprint);
            }
            Ok(None) => locker.backend_ok(),
            Err(error) => return self.read_failed(error),
        }
        let guard = match locker.clone().lock(key.clone()).await {
            Outcome::Locked(guard) => guard,
            Outcome::Unlocked => return Begin::Unlocked,
            Outcome::Rejected(rejection) => return Begin::Rejected(rejection),
        };
        match engine.record(&key).await {
            Ok(None) => Begin::Run(Completion::new(guard, fingerprint, self.shared.clone())),
            Ok(Some(record)) => {
                guard.release_now();
                self.answer(record, &fingerprint)
            }
            Err(error) => {
                guard.release_now();
                self.read_failed(error)
            }
        }
    }

    /// A record read failed: the request cannot know whether it already ran, so it is
    /// refused (`503`); the builder allows no other policy.
    fn read_failed(&self, error: LockError) -> Begin {
        // Logged as the lock's own failures are: once at the transition, then in periodic
        // summaries.
        self.shared.locker.backend_failed(&error);
        tracing::debug!(%error, "reading the idempotency record failed; rejecting");
        self.unavailable()
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
                "this idempotency key was already used with a different request (method, path and query, host, content type, fingerprinted headers or body)".to_owned(),
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
                if let Some(hook) = &self.shared.options.on_replay {
                    hook(&mut res);
                }
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
    /// Fed the whole body at the end, as canonical JSON.
    Json(Hasher),
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
            Fingerprinter::Json(mut h) => {
                match canonical_json(body) {
                    Some(canonical) => h.update(&canonical),
                    None => h.update(body),
                }
                h.finish()
            }
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
}

impl fmt::Debug for Completion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Completion")
            .field("lease", self.guard.info())
            .finish_non_exhaustive()
    }
}

impl Completion {
    fn new(guard: LockGuard, fingerprint: Bytes, shared: Arc<Shared>) -> Self {
        Completion {
            guard,
            fingerprint,
            shared,
        }
    }

    /// The lease the request runs under.
    pub fn info(&self) -> &LeaseInfo {
        self.guard.info()
    }

    /// Start capturing the response with this status and headers. A response that is
    /// not stored (one that means "try again": `408`, `409`, `423`, `425`, `429`, `5xx`
    /// unless the layer stores server errors, anything with `Retry-After`; by default
    /// `400`, `401`, `403`, `407`, `413`, `415`, `422`; whatever the layer's `store_if`
    /// refuses) is not captured: the
    /// key is released at the end of the body, with no record, and a retry runs again.
    pub fn capture(self, status: StatusCode, headers: &HeaderMap) -> Capture {
        let o = &self.shared.options;
        let state = if !o.stores(status, headers) {
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

    /// Run the response through without storing it: the key is released at the end of
    /// its body, and a retry runs again. For a response that carries the
    /// [`NotStored`](super::NotStored) mark.
    pub fn not_stored(self) -> Capture {
        Capture {
            completion: self,
            state: State::Release,
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

    /// The rest of the body will not be read (its client left and the
    /// [drain time](ReplayLocker::max_drain_time) ran out): what was to be kept is recorded
    /// as completed but not stored, so a retry is answered `409` `response-not-stored`
    /// rather than run a second time.
    pub fn cut_off(&mut self) {
        self.trailers();
    }

    /// How long the rest of the body is read once its client left.
    pub fn max_drain_time(&self) -> Duration {
        self.completion.shared.options.max_drain_time
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
                            tracing::warn!(%key, %error, "storing the response failed (sent twice); the key is released without a record, so a retry runs the request again");
                        }
                    }
                })
            }
        };
        let mut finish = Detachable::new(op);
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
