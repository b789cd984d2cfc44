//! The transactional protocol's steps for one covered request, written once for every
//! framework (the tower service here, actix-web's middleware in `tower-lock-actix`):
//! [`PendingClaim`] (the key, the fingerprint) → [`Claimed`] (the transaction, lent to the
//! handler) → [`Settled`] (rolled back, refused, or [`Storing`] the response and
//! committing it with the handler's rows).

use std::{fmt, sync::Arc};

use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use tower_lock_core::AcceptedCodings;

use super::{
    LentTransaction,
    lent::Returned,
    misuse::Misuse,
    open::OpenTransaction,
    shared::{Claim, Completion, Shared},
};
use crate::{Rejection, engine::LockKey, key::RequestView};

/// The answer of the layer in place of the handler's: a replay or a rejection, whole.
pub type Answer = http::Response<Bytes>;

/// Whether the layer covers a request
/// ([`TransactionalLayer::covers`](super::TransactionalLayer::covers)).
#[derive(Debug)]
pub enum Coverage {
    /// It runs under its key: read its body, then [`PendingClaim`].
    Covered(LockKey),
    /// It passes through untouched (a method the layer does not cover, no key under the
    /// pass-through policy).
    Passed,
    /// Answer with this: a missing or malformed key (`400`), the server's mistake (`500`).
    Refused(Answer),
}

/// Where rejections of one request point (`instance`): its path; and its content type,
/// which says whether it is a gRPC call, answered with a gRPC status rather than an HTTP
/// error its client could only report as `UNKNOWN`.
#[derive(Clone, Debug)]
struct Instance {
    path: String,
    content_type: Option<String>,
}

impl Instance {
    fn of(req: &dyn RequestView) -> Self {
        Self {
            path: req.path().to_owned(),
            content_type: req.header_str("content-type").map(str::to_owned),
        }
    }

    fn respond(&self, shared: &Shared, rejection: Rejection) -> Answer {
        let mut head = http::Request::new(());
        *head.uri_mut() = http::Uri::try_from(self.path.as_str()).unwrap_or_default();
        if let Some(ct) = self
            .content_type
            .as_deref()
            .and_then(|ct| http::HeaderValue::from_str(ct).ok())
        {
            head.headers_mut().insert(http::header::CONTENT_TYPE, ct);
        }
        shared.replay.respond(rejection, &head)
    }

    /// The `500` for a handler's `misuse` of its transaction, logged (throttled).
    fn misused(&self, shared: &Shared, misuse: Misuse) -> Answer {
        shared.misuse.report(misuse, shared.tables.records());
        let rejection = shared.replay.misconfigured(misuse.detail().to_owned());
        self.respond(shared, rejection)
    }
}

/// A covered request, its body read, before its key is claimed
/// ([`TransactionalLayer::pending`](super::TransactionalLayer::pending)).
pub struct PendingClaim {
    shared: Arc<Shared>,
    key: LockKey,
    fingerprint: Bytes,
    /// What the request accepts, for a replay's content coding.
    accepted: AcceptedCodings,
    instance: Instance,
}

impl fmt::Debug for PendingClaim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PendingClaim")
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

impl PendingClaim {
    pub(super) fn new(
        shared: Arc<Shared>,
        req: &dyn RequestView,
        key: LockKey,
        body: &[u8],
    ) -> Self {
        let fingerprint = shared.replay.fingerprint(req, body);
        let accepted = shared.replay.accepted(req);
        Self {
            shared,
            key,
            fingerprint,
            accepted,
            instance: Instance::of(req),
        }
    }

    /// Begin the transaction and claim the key: the request runs, or is answered from its
    /// record (a replay, `422`, `409`) or refused (`409` after the wait, `503`).
    pub async fn claim(self) -> Result<Claimed, Answer> {
        let Self {
            shared,
            key,
            fingerprint,
            accepted,
            instance,
        } = self;
        match shared.claim(&key, &fingerprint, accepted).await {
            Claim::Ours(tx) => Ok(Claimed {
                lent: LentTransaction::new(
                    tx,
                    Arc::clone(&shared.tables),
                    Arc::clone(&shared.misuse),
                ),
                shared,
                key,
                instance,
            }),
            Claim::Answer(Ok(replayed)) => Err(replayed),
            Claim::Answer(Err(rejection)) => Err(instance.respond(&shared, rejection)),
        }
    }
}

/// A request whose key its transaction holds: lend [`lent`](Self::lent) to the handler,
/// then [`settle`](Self::settle) with its answer. Dropped (an error, a panic), the
/// transaction rolls back; a framework keeps it running after its client left
/// ([`RunsOn`](super::RunsOn)).
pub struct Claimed {
    shared: Arc<Shared>,
    key: LockKey,
    lent: LentTransaction,
    instance: Instance,
}

impl fmt::Debug for Claimed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Claimed")
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

/// What becomes of a handler's answer ([`Claimed::settle`]).
#[derive(Debug)]
pub enum Settled {
    /// It said "it did not happen" (or a fence check refused its holder): rolled back;
    /// send the answer as it is.
    RolledBack,
    /// Send this instead (`500`: the handler kept the transaction; rolled back).
    Refused(Answer),
    /// Store it: read its body (at most [`Storing::max_body`]) and its trailers, and
    /// commit (or, for a gRPC status still to come, let the trailers decide:
    /// [`Storing::decided_by_trailers`]).
    Store(Storing),
}

impl Claimed {
    /// The transaction to put in the handler's request extensions.
    pub fn lent(&self) -> LentTransaction {
        self.lent.clone()
    }

    /// The handler failed (an error in place of an answer): roll back now, so that the
    /// retry finds the key free, rather than when the transaction is dropped.
    pub async fn abandon(self) {
        match self.lent.take_back() {
            Returned::Open(tx) | Returned::Doomed(tx) => tx.rollback().await,
            // Rolled back when its holder lets go.
            Returned::Held => {}
        }
    }

    /// Decide from the handler's answer (`marked`: it carries the
    /// [`NotStored`](crate::NotStored) mark) once the handler returned.
    pub async fn settle(self, status: StatusCode, headers: &HeaderMap, marked: bool) -> Settled {
        let Self {
            shared,
            key,
            lent,
            instance,
        } = self;
        let tx = match lent.take_back() {
            Returned::Open(tx) => tx,
            Returned::Doomed(tx) => {
                tx.rollback().await;
                return Settled::RolledBack;
            }
            Returned::Held => {
                return Settled::Refused(instance.misused(&shared, Misuse::Kept));
            }
        };
        if marked || !shared.replay.stores(status, headers) {
            // "It did not happen": nothing of it stays, and the retry runs cleanly.
            tx.rollback().await;
            return Settled::RolledBack;
        }
        let meta = shared.replay.encode_response(status, headers);
        // A gRPC head without its `grpc-status`: "did it happen" comes in the trailers,
        // and nothing commits before they say (the engine-backed layer's rule).
        let by_trailers = shared.replay.decided_by_trailers(headers);
        Settled::Store(Storing {
            shared,
            key,
            tx,
            status,
            meta,
            by_trailers,
            instance,
        })
    }
}

/// A storable answer on its way into the record; dropped, it rolls back.
pub struct Storing {
    shared: Arc<Shared>,
    key: LockKey,
    tx: OpenTransaction,
    status: StatusCode,
    /// The stored status and headers, `None` when the headers are over the limit.
    meta: Option<Bytes>,
    /// A gRPC response whose status comes in its trailers: they decide between commit
    /// and rollback, and without them (no status) it rolls back.
    by_trailers: bool,
    instance: Instance,
}

impl fmt::Debug for Storing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Storing")
            .field("key", &self.key)
            .field("status", &self.status)
            .finish_non_exhaustive()
    }
}

impl Storing {
    /// The largest body stored: read at most one byte more, then
    /// [`commit`](Self::commit) `None`.
    pub fn max_body(&self) -> usize {
        self.shared.replay.max_response_body()
    }

    /// How long the rest of the response body is read after its client left (the
    /// layer's `max_drain_time`, as the engine-backed layer's drain): past it, commit
    /// `None` (a tombstone: the request completed, its response is not stored).
    pub fn max_drain_time(&self) -> std::time::Duration {
        self.shared.replay.max_drain_time()
    }

    /// Whether the response's trailers decide (a gRPC response whose `grpc-status` was
    /// not in its head): read the body to them, past [`max_body`](Self::max_body) too
    /// (what is over is not kept, but the status still decides), then
    /// [`commit`](Self::commit) with them. Until then nothing commits.
    pub fn decided_by_trailers(&self) -> bool {
        self.by_trailers
    }

    /// Commit the record with the handler's rows: the response with `body` and its
    /// `trailers` (kept in the record, and replayed), or for a `body` of `None` (over
    /// [`max_body`](Self::max_body)) a tombstone, answered `409 response-not-stored` to
    /// retries.
    ///
    /// A response whose [trailers decide](Self::decided_by_trailers) is rolled back, with
    /// no record, when they say "try again" (the core's gRPC policy, as for a `503`) or
    /// when there are none (a stream that ended without its status, or a framework whose
    /// bodies carry no trailers: its client saw no status either); `Ok` then too, the
    /// answer sent as it is.
    ///
    /// On an error, the answer to send instead: `503` when the database failed, `500`
    /// naming the handler's mistake when the handler ended the transaction or let a
    /// failed statement abort it (nothing stored either way).
    pub async fn commit(
        self,
        body: Option<Bytes>,
        trailers: Option<&HeaderMap>,
    ) -> Result<(), Answer> {
        let replay = &self.shared.replay;
        if self.by_trailers
            && !trailers.is_some_and(|trailers| replay.stores_trailers(self.status, trailers))
        {
            // "It did not happen", or nobody can tell: nothing of it stays.
            self.tx.rollback().await;
            return Ok(());
        }
        let meta = match (self.meta, trailers) {
            (Some(meta), Some(trailers)) => replay.encode_with_trailers(&meta, trailers),
            (meta, _) => meta,
        };
        let (meta, body) = match (meta, body) {
            (Some(meta), Some(body)) => (meta, body),
            _ => (replay.encode_not_kept(self.status), Bytes::new()),
        };
        match self.shared.complete(self.tx, &self.key, meta, body).await {
            Ok(()) => {
                self.shared.sweep_if_due();
                Ok(())
            }
            Err(Completion::Failed(error)) => {
                tracing::warn!(%error, "committing the idempotency record failed");
                let rejection = replay.unavailable_rejection();
                Err(self.instance.respond(&self.shared, rejection))
            }
            Err(Completion::NotOurs) => Err(self.instance.misused(&self.shared, Misuse::Ended)),
            Err(Completion::Aborted) => {
                Err(self.instance.misused(&self.shared, Misuse::FailedStatement))
            }
        }
    }

    /// The body failed before its end: roll back, and the `503` to send instead.
    pub async fn abandon(self) -> Answer {
        self.tx.rollback().await;
        let rejection = self.shared.replay.unavailable_rejection();
        self.instance.respond(&self.shared, rejection)
    }
}
