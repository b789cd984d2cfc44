//! How a covered request's first step is decided: a stored record replayed or refused, a
//! duplicate in flight refused or waited for, or the key taken for the handler to run.

use std::{future::Future, sync::atomic::Ordering::Relaxed};

use bytes::Bytes;
use http::HeaderValue;

use super::super::{
    Completion, ReplayDecision, ReplayedTrailers,
    content_coding::AcceptedCodings,
    record_codec::{self, Stored},
};
use super::ReplayLocker;
use crate::{
    engine::{LockError, LockKey, Record},
    integration::{Outcome, dry_run::unheld},
    reject::{Rejection, RejectionKind},
};

impl ReplayLocker {
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

    pub(super) fn unavailable(&self) -> ReplayDecision {
        let locker = &self.locker;
        ReplayDecision::Rejected(locker.reject(
            RejectionKind::BackendUnavailable,
            "the lock service is unavailable".to_owned(),
            Some(locker.retry_after_fallback()),
        ))
    }

    pub(super) fn answer(&self, record: Record, request: &Request) -> ReplayDecision {
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
pub(super) struct Request {
    pub(super) fingerprint: Bytes,
    pub(super) accepted: AcceptedCodings,
}
