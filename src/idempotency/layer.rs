//! [`IdempotencyLayer`], the tower [`Layer`] built by an
//! [`IdempotencyLayerBuilder`](super::IdempotencyLayerBuilder).

use tower_layer::Layer;

use super::{builder::IdempotencyLayerBuilder, service::IdempotencyService};
use tower_lock_core::ReplayLocker;

use crate::{engine::LockEngine, metrics::LockMetrics};

/// Idempotency with response replay: runs the wrapped service at most once per
/// idempotency key (while its response is retained), answers concurrent duplicates with
/// `409` (or lets them wait), and replays the stored response to retries. Built with
/// [`IdempotencyLayer::builder`]; see the [module docs](super).
///
/// Install a compression layer outside it, so that each replay is encoded for its own
/// request. Inside it, the stored response keeps the first request's encoding, and a
/// retry whose `Accept-Encoding` does not accept it is refused (`409
/// response-not-stored`, one warning), never sent a body it cannot decode.
#[derive(Clone, Debug)]
pub struct IdempotencyLayer {
    replay: ReplayLocker,
}

impl IdempotencyLayer {
    /// A builder of idempotency with replay on `engine`, after the IETF Idempotency-Key
    /// draft: the key is the `Idempotency-Key` header (required: `400` when missing or
    /// malformed); a duplicate in flight is answered `409 Conflict` at once (or waits, with
    /// [`wait`](IdempotencyLayerBuilder::wait)), and a retry after completion gets the
    /// stored response replayed (`422` if its request differs). It applies to `POST` and
    /// `PATCH` (the methods that are not idempotent by definition); other methods pass
    /// through untouched (change with [`methods`](IdempotencyLayerBuilder::methods)).
    ///
    /// **Say whose requests share records** before building: per principal
    /// ([`per_principal`](IdempotencyLayerBuilder::per_principal), an identity your
    /// authentication layer put in the request extensions), by a scope the server derives
    /// ([`scope_by`](IdempotencyLayerBuilder::scope_by)), or explicitly
    /// [`unscoped`](IdempotencyLayerBuilder::unscoped) for anonymous public endpoints.
    /// Without a decision, [`build`](IdempotencyLayerBuilder::build) refuses
    /// ([`ConfigError::IdempotencyScope`](crate::ConfigError::IdempotencyScope)): two
    /// callers sending the same key (`order-1` is common) would otherwise be handed each
    /// other's stored responses.
    ///
    /// ```
    /// use std::fmt;
    /// use tower_lock::{IdempotencyLayer, LockEngine};
    ///
    /// /// What the application's authentication layer puts in the request extensions.
    /// #[derive(Clone)]
    /// struct AccountId(u64);
    ///
    /// impl fmt::Display for AccountId {
    ///     fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    ///         write!(f, "{}", self.0)
    ///     }
    /// }
    ///
    /// let layer = IdempotencyLayer::builder(LockEngine::in_memory())
    ///     .per_principal::<AccountId>()
    ///     .build()
    ///     .unwrap();
    /// # let _ = layer;
    /// ```
    pub fn builder(engine: LockEngine) -> IdempotencyLayerBuilder {
        IdempotencyLayerBuilder::new(engine)
    }

    pub(crate) fn new(replay: ReplayLocker) -> Self {
        Self { replay }
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
    /// use tower_lock::{IdempotencyLayer, LockEngine};
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
    /// let layer = IdempotencyLayer::builder(engine.clone()).per_principal::<AccountId>().build()?;
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
