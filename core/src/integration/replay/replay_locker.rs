//! [`ReplayLocker`]: the framework-neutral core of idempotency replay, from a request's
//! key and fingerprint to "replay this", "refuse this" or "run it, then complete".

use std::{
    fmt,
    future::Future,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering::Relaxed},
    },
    time::Duration,
};

use bytes::Bytes;
use http::HeaderValue;

use super::{
    Completion, ReplayAdapter, ReplayDecision, ReplayFuture, ReplayedTrailers,
    content_coding::AcceptedCodings,
    fingerprint::Fingerprinter,
    options::ReplayOptions,
    record_codec::{self, Stored},
};
use crate::{
    engine::{LockError, LockKey, Record},
    integration::{Outcome, RequestLocker, dry_run::unheld},
    key::RequestView,
    reject::{Rejection, RejectionKind},
};

/// The runtime core of an `IdempotencyLayer`, shared with framework integrations: which
/// requests it covers, their fingerprints, and the decision for each (replay, refuse, or
/// run and store). Cheap to clone.
///
/// A framework hands it each request behind its [`ReplayAdapter`] ([`serve`](Self::serve));
/// the protocol is written here once: the key (before the body is read), the whole body
/// read and fingerprinted (at most [`max_request_body`](Self::max_request_body) bytes),
/// the decision (replay, refuse, or run holding the key), the handler kept running when
/// its client leaves, and its response captured as it streams out, then stored in the
/// step that releases the key.
#[derive(Clone)]
pub struct ReplayLocker {
    pub(super) locker: RequestLocker,
    pub(super) options: Arc<ReplayOptions>,
    /// Whether a replay refused for its content coding has been logged (once per layer:
    /// the cause is the server's layer order, and the fix one line).
    encoding_logged: Arc<AtomicBool>,
}

impl fmt::Debug for ReplayLocker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let o = &self.options;
        f.debug_struct("ReplayLocker")
            .field("locker", &self.locker)
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

impl ReplayLocker {
    #[doc(hidden)]
    pub fn new(locker: RequestLocker, options: ReplayOptions) -> Self {
        Self {
            locker,
            options: Arc::new(options),
            encoding_logged: Arc::default(),
        }
    }

    /// The lock core underneath: key extraction, waiting, rejections, metrics.
    pub fn locker(&self) -> &RequestLocker {
        &self.locker
    }

    /// Serve one request, seen through its framework's `adapter`: the future resolves to
    /// the middleware's answer (the handler's response, captured for replay when it runs
    /// under its key; a replayed response; a rejection), or the handler's error.
    ///
    /// The key is extracted in this call, so a request the layer does not cover goes
    /// straight to the handler when the future is first polled.
    pub fn serve<A: ReplayAdapter>(&self, adapter: A) -> ReplayFuture<A> {
        ReplayFuture::new(self, adapter)
    }

    /// The key of `req`, before its body is read: `Ok(None)` when the request passes
    /// through untouched (a method the layer does not cover, or no key under the
    /// pass-through policy), a `400` rejection for a missing or malformed key.
    pub(super) fn key(&self, req: &dyn RequestView) -> Result<Option<LockKey>, Rejection> {
        let locker = &self.locker;
        if !locker.locks_method(req.method()) || locker.passes_unrouted(req) {
            return Ok(None);
        }
        let key = match locker.key(req) {
            // A dry run rejects nothing: the request passes, its rejection counted.
            Err(rejection) if locker.is_dry_run() => {
                locker.would_have(&rejection);
                return Ok(None);
            }
            key => key?,
        };
        if key.is_none() {
            locker.metrics().unlocked();
        }
        Ok(key)
    }

    /// The largest request body the layer reads (and fingerprints); a larger one is
    /// answered `413`.
    pub fn max_request_body(&self) -> usize {
        self.options.max_request_body
    }

    /// A fingerprint fed chunk by chunk as the body streams in.
    pub(super) fn fingerprinter(&self, req: &dyn RequestView) -> Fingerprinter {
        let o = &self.options;
        Fingerprinter::new(&o.fingerprint, &o.fingerprint_headers, req)
    }

    /// How long the rest of a response body is read after its client left (see
    /// `IdempotencyLayerBuilder::max_drain_time`).
    pub fn max_drain_time(&self) -> Duration {
        self.options.max_drain_time
    }

    /// The lock key of the record for idempotency key `key` sent within `scope` (the
    /// value the layer's scope takes: the principal's `Display`, the extractor's value;
    /// `None` for an unscoped layer), for operators who inspect or delete one record.
    /// `None` when `scope` does not fit the layer's (a scope given to an unscoped layer,
    /// or none to a scoped one) or the key is not valid key material.
    pub fn record_key(&self, scope: Option<&str>, key: &str) -> Option<LockKey> {
        let value = self.options.scope.value(scope, key)?;
        self.locker.key_for(&value).ok()
    }

    /// The `413` rejection for a request body over [`max_request_body`](Self::max_request_body).
    #[doc(hidden)]
    pub fn too_large(&self) -> Rejection {
        self.locker.reject(
            RejectionKind::RequestTooLarge,
            format!(
                "an idempotent request body may be at most {} bytes",
                self.max_request_body()
            ),
            None,
        )
    }

    /// The `400` rejection for a request body that failed before its end.
    #[doc(hidden)]
    pub fn unreadable(&self) -> Rejection {
        self.locker.reject(
            RejectionKind::UnreadableBody,
            "the request body ended with an error before it was complete".to_owned(),
            None,
        )
    }

    /// The response for `rejection` (see [`RequestLocker::respond`]).
    #[doc(hidden)]
    pub fn respond(&self, rejection: Rejection, req: &dyn RequestView) -> http::Response<Bytes> {
        self.locker.respond(rejection, req)
    }

    // The transactional layer's steps (tower-lock's `idempotency::transactional`, on
    // Postgres): the same key, fingerprint, store policy, limits, rejections and replays
    // as this protocol, with the record kept in the application's database instead of the
    // engine. Hidden: the layer's, not an API.

    #[doc(hidden)]
    pub fn request_key(&self, req: &dyn RequestView) -> Result<Option<LockKey>, Rejection> {
        self.key(req)
    }

    #[doc(hidden)]
    pub fn accepted(&self, req: &dyn RequestView) -> AcceptedCodings {
        AcceptedCodings::of(req)
    }

    #[doc(hidden)]
    pub fn fingerprint(&self, req: &dyn RequestView, body: &[u8]) -> Bytes {
        let mut fingerprinter = self.fingerprinter(req);
        fingerprinter.update(body);
        fingerprinter.finish(req, body)
    }

    #[doc(hidden)]
    pub fn stores(&self, status: http::StatusCode, headers: &http::HeaderMap) -> bool {
        self.options.stores(status, headers)
    }

    #[doc(hidden)]
    pub fn max_response_body(&self) -> usize {
        self.options.max_response_body
    }

    #[doc(hidden)]
    pub fn retention(&self) -> Duration {
        self.options.retention
    }

    /// How long a duplicate waits for the request in flight with its key.
    #[doc(hidden)]
    pub fn wait(&self) -> Duration {
        self.locker.shared.config.wait
    }

    /// The record's metadata for a stored response, `None` when its headers are over the
    /// limit.
    #[doc(hidden)]
    pub fn encode_response(
        &self,
        status: http::StatusCode,
        headers: &http::HeaderMap,
    ) -> Option<Bytes> {
        record_codec::encode(status, headers, self.options.max_response_headers)
    }

    /// The record's metadata for a response too large to keep.
    #[doc(hidden)]
    pub fn encode_not_kept(&self, status: http::StatusCode) -> Bytes {
        record_codec::encode_not_kept(status)
    }

    /// The replay of `record`, or the rejection it calls for (`422`, `409`
    /// `response-not-stored`, `503` for an unreadable record).
    #[doc(hidden)]
    pub fn answer_record(
        &self,
        record: Record,
        fingerprint: &Bytes,
        accepted: AcceptedCodings,
    ) -> Result<http::Response<Bytes>, Rejection> {
        let request = Request {
            fingerprint: fingerprint.clone(),
            accepted,
        };
        match self.answer(record, &request) {
            ReplayDecision::Replay(res) => Ok(res),
            ReplayDecision::Rejected(rejection) => Err(rejection),
            ReplayDecision::Run(_) | ReplayDecision::Unlocked(_) => {
                unreachable!("a record is replayed or refused")
            }
        }
    }

    /// The `409` for a duplicate whose first request was still in flight after the wait.
    #[doc(hidden)]
    pub fn in_flight(&self) -> Rejection {
        let locker = &self.locker;
        locker.reject(
            RejectionKind::Conflict,
            "a request with this idempotency key is in progress".to_owned(),
            Some(locker.retry_after_fallback()),
        )
    }

    /// The `503` for a database that failed the request's transaction.
    #[doc(hidden)]
    pub fn unavailable_rejection(&self) -> Rejection {
        match self.unavailable() {
            ReplayDecision::Rejected(rejection) => rejection,
            _ => unreachable!("unavailable is a rejection"),
        }
    }

    /// The `500` for a server-side mistake (a handler that kept the transaction).
    #[doc(hidden)]
    pub fn misconfigured(&self, detail: String) -> Rejection {
        self.locker
            .reject(RejectionKind::Misconfigured, detail, None)
    }

    /// Decide for the request with `key` and `fingerprint`: a completed record is
    /// replayed (or refused `422` when the fingerprint differs) without taking the lock;
    /// otherwise the key is locked as the layer is configured (`409` for a duplicate in
    /// flight, or a wait). The record check and the acquisition are one step
    /// ([`Lock::acquire_or_record`](crate::engine::Lock::acquire_or_record): one round
    /// trip on Redis, for a first request as for a replay), and a grant after a wait looks
    /// again, because the request that held the key before may have completed meanwhile.
    /// Records are written only together with the release of the lock that guarded them,
    /// so a look made while holding the key is final. A stored response is replayed only
    /// in a content coding the request `accepted`.
    ///
    /// The returned future borrows nothing; dropping it gives up the wait.
    pub(crate) fn begin(
        &self,
        key: LockKey,
        fingerprint: Bytes,
        accepted: AcceptedCodings,
    ) -> impl Future<Output = ReplayDecision> + Send + 'static {
        let this = self.clone();
        async move {
            let request = Request {
                fingerprint,
                accepted,
            };
            if !this.locker.is_dry_run() {
                return this.decide(key, request).await;
            }
            let decision = this.clone().decide(key.clone(), request).await;
            this.observed(decision, &key)
        }
    }

    /// In a dry run, a replay or a rejection turned into running the request unlocked
    /// (counted and logged) with the lease info of `key`; otherwise `decision`.
    fn observed(&self, decision: ReplayDecision, key: &LockKey) -> ReplayDecision {
        let locker = &self.locker;
        if !locker.is_dry_run() {
            return decision;
        }
        match decision {
            ReplayDecision::Rejected(rejection) => {
                locker.would_have(&rejection);
                ReplayDecision::Unlocked(Some(unheld(Some(key))))
            }
            ReplayDecision::Replay(response) => {
                tracing::info!(
                    layer = locker.shared.config.name.as_str(),
                    status = response.status().as_u16(),
                    "dry run: would have replayed the stored response; the request runs"
                );
                ReplayDecision::Unlocked(Some(unheld(Some(key))))
            }
            decision => decision,
        }
    }

    async fn decide(self, key: LockKey, request: Request) -> ReplayDecision {
        let locker = &self.locker;
        if locker.shared.local.is_some() {
            // Not reached by the preset (it refuses the degrade policy): the steps apart.
            return self.decide_in_steps(key, request).await;
        }
        match locker.clone().lock_or_record(key).await {
            Ok(Outcome::Locked(guard)) => {
                ReplayDecision::Run(Completion::new(guard, request.fingerprint, self.clone()))
            }
            Ok(Outcome::Unlocked) => ReplayDecision::Unlocked(None),
            Ok(Outcome::Observed(info)) => ReplayDecision::Unlocked(Some(info)),
            Ok(Outcome::Rejected(rejection)) => ReplayDecision::Rejected(rejection),
            Err(record) => {
                locker.backend_ok();
                self.answer(record, &request)
            }
        }
    }

    /// [`decide`](Self::decide) as a read, an acquisition and a second read.
    async fn decide_in_steps(self, key: LockKey, request: Request) -> ReplayDecision {
        let locker = &self.locker;
        let engine = locker.engine().clone();
        // Most retries find a completed record: answered in one read, without the lock.
        match engine.record(&key).await {
            Ok(Some(record)) => {
                locker.backend_ok();
                return self.answer(record, &request);
            }
            Ok(None) => locker.backend_ok(),
            Err(error) => return self.read_failed(&error),
        }
        let guard = match locker.clone().lock(key.clone()).await {
            Outcome::Locked(guard) => guard,
            Outcome::Unlocked => return ReplayDecision::Unlocked(None),
            Outcome::Observed(info) => return ReplayDecision::Unlocked(Some(info)),
            Outcome::Rejected(rejection) => return ReplayDecision::Rejected(rejection),
        };
        match engine.record(&key).await {
            Ok(None) => {
                ReplayDecision::Run(Completion::new(guard, request.fingerprint, self.clone()))
            }
            Ok(Some(record)) => {
                guard.release_now();
                self.answer(record, &request)
            }
            Err(error) => {
                guard.release_now();
                self.read_failed(&error)
            }
        }
    }

    /// A record read failed: the request cannot know whether it already ran, so it is
    /// refused (`503`); the builder allows no other policy.
    fn read_failed(&self, error: &LockError) -> ReplayDecision {
        // Logged as the lock's own failures are: once at the transition, then in periodic
        // summaries.
        self.locker.backend_failed(error);
        tracing::debug!(%error, "reading the idempotency record failed; rejecting");
        self.unavailable()
    }

    fn unavailable(&self) -> ReplayDecision {
        let locker = &self.locker;
        ReplayDecision::Rejected(locker.reject(
            RejectionKind::BackendUnavailable,
            "the lock service is unavailable".to_owned(),
            Some(locker.retry_after_fallback()),
        ))
    }

    fn answer(&self, record: Record, request: &Request) -> ReplayDecision {
        let locker = &self.locker;
        if record.fingerprint != request.fingerprint {
            return ReplayDecision::Rejected(locker.reject(
                RejectionKind::FingerprintMismatch,
                "this idempotency key was already used with a different request (method, path and query, content type, fingerprinted headers or body, or the host where it counts)".to_owned(),
                None,
            ));
        }
        if !record.kept {
            // A tombstone: the request completed, but the store could not keep its
            // response (the in-process record budget). Never run again; no status to tell.
            return ReplayDecision::Rejected(locker.reject(
                RejectionKind::NotReplayable,
                "the request with this idempotency key completed, but its response could not be kept, so it cannot be replayed".to_owned(),
                None,
            ));
        }
        match record_codec::decode(&record.meta) {
            Some(Stored::Response {
                status,
                headers,
                trailers,
            }) => {
                if let Some(coding) = request.accepted.refused(&headers) {
                    return ReplayDecision::Rejected(self.unaccepted_coding(coding, status));
                }
                locker.metrics().replayed();
                let mut res = http::Response::new(record.body);
                *res.status_mut() = status;
                *res.headers_mut() = headers;
                if let Some(trailers) = trailers {
                    res.extensions_mut().insert(ReplayedTrailers(trailers));
                }
                res.headers_mut().insert(
                    self.options.replayed_header.clone(),
                    HeaderValue::from_static("true"),
                );
                if let Some(hook) = &self.options.on_replay {
                    hook(&mut res);
                }
                ReplayDecision::Replay(res)
            }
            Some(Stored::NotKept { status }) => ReplayDecision::Rejected(
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

    /// The stored response is in a content coding the retry did not accept (a compression
    /// layer inside this one encoded it for the first request): refused, never sent in an
    /// encoding the client cannot read, and logged once, naming the fix.
    fn unaccepted_coding(&self, coding: &str, status: http::StatusCode) -> Rejection {
        if !self.encoding_logged.swap(true, Relaxed) {
            tracing::warn!(
                layer = self.locker.shared.config.name.as_str(),
                coding,
                "a stored response was encoded ({coding}) by a compression layer inside the idempotency layer, and a retry does not accept that encoding: refused (409); install the compression layer outside the idempotency layer"
            );
        }
        self.locker
            .reject(
                RejectionKind::NotReplayable,
                format!(
                    "the request with this idempotency key completed with status {status}, but its stored response is {coding}-encoded, which this request does not accept (Accept-Encoding), so it cannot be replayed"
                ),
                None,
            )
            .with_original_status(status.as_u16())
    }
}

/// What the replay decision needs of the request: its fingerprint, and the content
/// codings it accepts.
struct Request {
    fingerprint: Bytes,
    accepted: AcceptedCodings,
}
