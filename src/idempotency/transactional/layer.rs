//! [`TransactionalLayer`], the tower [`Layer`] built by a
//! [`TransactionalLayerBuilder`](super::TransactionalLayerBuilder).

use std::{fmt, sync::Arc};

use tower_layer::Layer;

use super::{TransactionalService, shared::Shared};
use crate::metrics::LockMetrics;

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
