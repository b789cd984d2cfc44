//! [`ReplayLocker`]: the framework-neutral core of idempotency replay, from a request's
//! key and fingerprint to "replay this", "refuse this" or "run it, then complete".

use std::{fmt, future::Future, sync::Arc, time::Duration};

use bytes::Bytes;
use http::HeaderValue;
use tokio::time::Instant;

use super::{
    Completion, ReplayDecision,
    fingerprint::Fingerprinter,
    options::ReplayOptions,
    record_codec::{self, Stored},
};
use crate::{
    engine::{Acquired, LockError, LockKey, Mode, Record},
    integration::{Outcome, RequestLocker},
    key::RequestView,
    reject::{Rejection, RejectionKind},
};

/// What every clone of a [`ReplayLocker`] (and each request's [`Completion`]) shares.
pub(super) struct Shared {
    pub(super) locker: RequestLocker,
    pub(super) options: ReplayOptions,
}

/// The runtime core of an [`IdempotencyLayer`](crate::IdempotencyLayer), shared with
/// framework integrations: which requests it covers, their fingerprints, and the decision
/// for each (replay, refuse, or run and complete). Cheap to clone.
///
/// The steps for one request: [`key`](Self::key) (before the body is read), the whole
/// body through [`fingerprint`](Self::fingerprint) (at most
/// [`max_request_body`](Self::max_request_body) bytes), then [`begin`](Self::begin). A
/// [`ReplayDecision::Run`] carries the [`Completion`] the response is captured into;
/// [`KeepRunning`](super::KeepRunning) and [`CapturingBody`](super::CapturingBody) carry it
/// through the handler and the response body.
#[derive(Clone)]
pub struct ReplayLocker {
    pub(super) shared: Arc<Shared>,
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

impl ReplayLocker {
    pub(crate) fn new(locker: RequestLocker, options: ReplayOptions) -> Self {
        Self {
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
    /// [`IdempotencyLayerBuilder::fingerprint_with`](crate::IdempotencyLayerBuilder::fingerprint_with)
    /// for what the default covers).
    pub fn fingerprint(&self, req: &dyn RequestView, body: &[u8]) -> Bytes {
        let mut f = self.fingerprinter(req);
        f.update(body);
        f.finish(req, body)
    }

    /// A fingerprint fed chunk by chunk as the body streams in.
    pub(crate) fn fingerprinter(&self, req: &dyn RequestView) -> Fingerprinter {
        let o = &self.shared.options;
        Fingerprinter::new(&o.fingerprint, &o.fingerprint_headers, req)
    }

    /// How long the rest of a response body is read after its client left (see
    /// [`IdempotencyLayerBuilder::max_drain_time`](crate::IdempotencyLayerBuilder::max_drain_time)).
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
    /// flight, or a wait). The record check and the acquisition are one step
    /// ([`Lock::acquire_or_record`](crate::engine::Lock::acquire_or_record): one round
    /// trip on Redis, for a first request as for a replay), and a grant after a wait looks
    /// again, because the request that held the key before may have completed meanwhile.
    /// Records are written only together with the release of the lock that guarded them,
    /// so a look made while holding the key is final.
    ///
    /// The returned future borrows nothing; dropping it gives up the wait.
    pub fn begin(
        &self,
        key: LockKey,
        fingerprint: Bytes,
    ) -> impl Future<Output = ReplayDecision> + Send + 'static {
        let this = self.clone();
        async move { this.decide(key, fingerprint).await }
    }

    async fn decide(self, key: LockKey, fingerprint: Bytes) -> ReplayDecision {
        let locker = &self.shared.locker;
        if locker.shared.local.is_some() {
            // Not reached by the preset (it refuses the degrade policy): the steps apart.
            return self.decide_in_steps(key, fingerprint).await;
        }
        match locker.clone().lock_or_record(key).await {
            Ok(Outcome::Locked(guard)) => {
                ReplayDecision::Run(Completion::new(guard, fingerprint, self.shared.clone()))
            }
            Ok(Outcome::Unlocked) => ReplayDecision::Unlocked,
            Ok(Outcome::Rejected(rejection)) => ReplayDecision::Rejected(rejection),
            Err(record) => {
                locker.backend_ok();
                self.answer(record, &fingerprint)
            }
        }
    }

    /// [`decide`](Self::decide) as a read, an acquisition and a second read.
    async fn decide_in_steps(self, key: LockKey, fingerprint: Bytes) -> ReplayDecision {
        let locker = &self.shared.locker;
        let engine = locker.engine().clone();
        // Most retries find a completed record: answered in one read, without the lock.
        match engine.record(&key).await {
            Ok(Some(record)) => {
                locker.backend_ok();
                return self.answer(record, &fingerprint);
            }
            Ok(None) => locker.backend_ok(),
            Err(error) => return self.read_failed(&error),
        }
        let guard = match locker.clone().lock(key.clone()).await {
            Outcome::Locked(guard) => guard,
            Outcome::Unlocked => return ReplayDecision::Unlocked,
            Outcome::Rejected(rejection) => return ReplayDecision::Rejected(rejection),
        };
        match engine.record(&key).await {
            Ok(None) => {
                ReplayDecision::Run(Completion::new(guard, fingerprint, self.shared.clone()))
            }
            Ok(Some(record)) => {
                guard.release_now();
                self.answer(record, &fingerprint)
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
        self.shared.locker.backend_failed(error);
        tracing::debug!(%error, "reading the idempotency record failed; rejecting");
        self.unavailable()
    }

    fn unavailable(&self) -> ReplayDecision {
        let locker = &self.shared.locker;
        ReplayDecision::Rejected(locker.reject(
            RejectionKind::BackendUnavailable,
            "the lock service is unavailable".to_owned(),
            Some(locker.retry_after_fallback()),
        ))
    }

    fn answer(&self, record: Record, fingerprint: &Bytes) -> ReplayDecision {
        let locker = &self.shared.locker;
        if record.fingerprint != *fingerprint {
            return ReplayDecision::Rejected(locker.reject(
                RejectionKind::FingerprintMismatch,
                "this idempotency key was already used with a different request (method, path and query, host, content type, fingerprinted headers or body)".to_owned(),
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
}

/// What only replay asks of the lock core.
impl RequestLocker {
    /// Lock `key` as [`lock`](Self::lock) does, unless a record is stored under it:
    /// `Err(record)`, and nothing is held.
    pub(super) async fn lock_or_record(self, key: LockKey) -> Result<Outcome, Record> {
        let started = Instant::now();
        let lock = self.lock_handle(&self.shared.engine, &key, self.shared.config.wait);
        let result = match lock.acquire_or_record().await {
            Ok(Acquired::Record(record)) => return Err(record),
            Ok(Acquired::Lease(lease)) => Ok(lease),
            Err(error) => Err(error),
        };
        Ok(self.settle(result, Mode::Exclusive, started))
    }

    /// The backend failed outside an acquisition (idempotency replay's record read): the
    /// same outage log as a failed acquisition.
    pub(super) fn backend_failed(&self, error: &LockError) {
        if let LockError::Backend(error) = error {
            let c = &self.shared.config;
            self.shared.outage.failed(&c.name, error, c.backend_failure);
        }
    }

    /// The backend answered outside an acquisition: ends a logged outage.
    pub(super) fn backend_ok(&self) {
        self.shared.outage.answered(&self.shared.config.name);
    }

    pub(super) fn retry_after_fallback(&self) -> Duration {
        self.shared.config.retry_after_fallback
    }
}
