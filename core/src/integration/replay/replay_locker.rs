//! [`ReplayLocker`]: the framework-neutral core of idempotency replay, from a request's
//! key and fingerprint to "replay this", "refuse this" or "run it, then complete".

use std::{
    fmt,
    sync::{Arc, atomic::AtomicBool},
    time::Duration,
};

use bytes::Bytes;

use super::{
    ReplayAdapter, ReplayDecision, ReplayFuture, content_coding::AcceptedCodings,
    fingerprint::Fingerprinter, options::ReplayOptions, record_codec,
};
use crate::{
    engine::{LockKey, Record},
    integration::RequestLocker,
    key::RequestView,
    reject::{Rejection, RejectionKind},
};

mod deciding;

use deciding::Request;

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
}
