//! [`IdempotencyLayer`], the tower [`Layer`] built by an
//! [`IdempotencyLayerBuilder`](super::IdempotencyLayerBuilder).

use tower_layer::Layer;

use super::{replay_locker::ReplayLocker, service::IdempotencyService};
use crate::metrics::LockMetrics;

/// Idempotency with response replay: runs the wrapped service at most once per
/// idempotency key (while its response is retained), answers concurrent duplicates with
/// `409` (or lets them wait), and replays the stored response to retries. Built with
/// [`LockLayer::idempotency`](crate::LockLayer::idempotency); see the
/// [module docs](super).
#[derive(Clone, Debug)]
pub struct IdempotencyLayer {
    replay: ReplayLocker,
}

impl IdempotencyLayer {
    pub(crate) fn new(replay: ReplayLocker) -> Self {
        IdempotencyLayer { replay }
    }

    /// The layer's counters and histograms (replays included).
    pub fn metrics(&self) -> LockMetrics {
        self.replay.locker().metrics()
    }

    /// The framework-neutral core behind the layer, for framework integrations.
    pub fn replay_locker(&self) -> &ReplayLocker {
        &self.replay
    }
}

impl<S> Layer<S> for IdempotencyLayer {
    type Service = IdempotencyService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        IdempotencyService::new(inner, self.replay.clone())
    }
}
