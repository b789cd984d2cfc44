//! [`TransactionalLayer`], the tower [`Layer`] built by a
//! [`TransactionalLayerBuilder`](super::TransactionalLayerBuilder).

use std::{fmt, sync::Arc};

use tower_layer::Layer;

use super::{Coverage, PendingClaim, TransactionalService, protocol::Answer, shared::Shared};
use crate::{engine::LockKey, key::RequestView, metrics::LockMetrics};

/// Idempotency whose records commit in the handler's own Postgres transaction: see the
/// [module docs](super). Cheap to clone; every service it wraps shares one pool and one
/// records table.
#[derive(Clone)]
pub struct TransactionalLayer {
    shared: Arc<Shared>,
}

impl fmt::Debug for TransactionalLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TransactionalLayer")
            .field("records", &self.shared.tables.records())
            .field("replay", &self.shared.replay)
            .finish_non_exhaustive()
    }
}

impl TransactionalLayer {
    pub(super) fn new(shared: Shared) -> Self {
        Self {
            shared: Arc::new(shared),
        }
    }

    /// The framework-neutral core behind the layer (keys, fingerprints, rejections), for
    /// framework integrations.
    pub fn replay_locker(&self) -> &tower_lock_core::ReplayLocker {
        &self.shared.replay
    }

    /// The layer's counters (replays and rejections).
    pub fn metrics(&self) -> LockMetrics {
        self.shared.replay.locker().metrics()
    }

    /// Delete one batch (500) of expired records now; the number deleted. The layer does
    /// this by itself in the background (at most once a minute, at least once per
    /// retention, when requests complete); this is for a maintenance task or a test.
    pub async fn sweep(&self) -> Result<u64, sqlx::Error> {
        self.shared.sweep().await
    }

    /// How many sweeps of expired records failed since the layer was built, the
    /// background's and [`sweep`](Self::sweep)'s: each is also a `warn!` naming its cause.
    /// Export it to your metrics (a counter): while it rises, expired records are not
    /// deleted.
    pub fn failed_sweeps(&self) -> u64 {
        self.shared.failed_sweeps()
    }

    /// For framework integrations (the tower service uses the same steps): whether the
    /// layer covers `req`, and its key.
    pub fn covers(&self, req: &dyn RequestView) -> Coverage {
        let replay = &self.shared.replay;
        match replay.request_key(req) {
            Ok(Some(key)) => Coverage::Covered(key),
            Ok(None) => Coverage::Passed,
            Err(rejection) => Coverage::Refused(replay.respond(rejection, req)),
        }
    }

    /// The largest request body read and fingerprinted.
    pub fn max_request_body(&self) -> usize {
        self.shared.replay.max_request_body()
    }

    /// The answer to a covered request whose body was over
    /// [`max_request_body`](Self::max_request_body) (`too_large`: `413`) or failed (`400`).
    pub fn refuse_body(&self, too_large: bool, req: &dyn RequestView) -> Answer {
        let replay = &self.shared.replay;
        let rejection = if too_large {
            replay.too_large()
        } else {
            replay.unreadable()
        };
        replay.respond(rejection, req)
    }

    /// The covered request `req` with key `key` (from [`covers`](Self::covers)) and its
    /// whole `body`, fingerprinted, ready to [`claim`](PendingClaim::claim).
    pub fn pending(&self, req: &dyn RequestView, key: LockKey, body: &[u8]) -> PendingClaim {
        PendingClaim::new(Arc::clone(&self.shared), req, key, body)
    }

    /// The lock key (the records table's `key`) of idempotency key `key` sent within
    /// `scope`, as [`IdempotencyLayer::record_key`](crate::IdempotencyLayer::record_key).
    pub fn record_key(&self, scope: Option<&str>, key: &str) -> Option<crate::engine::LockKey> {
        self.shared.replay.record_key(scope, key)
    }
}

impl<S> Layer<S> for TransactionalLayer {
    type Service = TransactionalService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        TransactionalService::new(inner, Arc::clone(&self.shared))
    }
}
