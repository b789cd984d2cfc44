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

    /// The lock key of the record that idempotency key `key` has within `scope` (the
    /// scope's value: the principal's `Display`, the scope extractor's value; `None` for
    /// an unscoped layer), for an operator who inspects or deletes one record with
    /// [`LockEngine::record`](crate::LockEngine::record) and
    /// [`LockEngine::forget_record`](crate::LockEngine::forget_record). `None` when the
    /// scope does not fit the layer, or the key is not valid key material.
    ///
    /// ```
    /// use std::fmt;
    /// use tower_lock::{LockEngine, LockLayer};
    ///
    /// #[derive(Clone)]
    /// struct AccountId(u64);
    ///
    /// impl fmt::Display for AccountId {
    ///     fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    ///         write!(f, "{}", self.0)
    ///     }
    /// }
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let engine = LockEngine::in_memory();
    /// let layer = LockLayer::idempotency(engine.clone()).per_principal::<AccountId>().build()?;
    /// // Account 42 asks support to forget its `order-7`: the next request with it runs.
    /// let key = layer.record_key(Some("42"), "order-7").expect("a scoped key");
    /// if let Some(record) = engine.record(&key).await? {
    ///     println!("completed at {:?}", record.completed_at);
    /// }
    /// engine.forget_record(&key).await?;
    /// assert!(layer.record_key(None, "order-7").is_none(), "the layer is scoped");
    /// # Ok(())
    /// # }
    /// ```
    pub fn record_key(&self, scope: Option<&str>, key: &str) -> Option<crate::engine::LockKey> {
        self.replay.record_key(scope, key)
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
