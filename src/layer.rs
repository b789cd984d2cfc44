//! [`LockLayer`], the tower [`Layer`] built by a [`LockLayerBuilder`].
//!
//! ```
//! use std::time::Duration;
//! use http::HeaderName;
//! use tower_lock::{LockEngine, LockLayer, key::HeaderKey};
//!
//! # fn main() -> Result<(), tower_lock::ConfigError> {
//! let layer = LockLayer::builder(LockEngine::in_memory())
//!     .key(HeaderKey::new(HeaderName::from_static("x-tenant-id")))
//!     .wait(Duration::from_secs(5)) // queue up to 5 s, then 429
//!     .fifo(true)                   // in arrival order
//!     .max_waiters(32)              // more than 32 waiting: 429 at once
//!     .build()?;
//! # let _ = layer;
//! # Ok(())
//! # }
//! ```

use tower_layer::Layer;

use crate::{
    builder::LockLayerBuilder, engine::LockEngine, idempotency::IdempotencyLayerBuilder,
    integration::RequestLocker, metrics::LockMetrics, options::MissingKeyPolicy,
    reject::RejectionKind, service::LockService,
};

/// Serializes the wrapped service per lock key; see the [crate docs](crate).
///
/// The layer holds an `Arc` of its configuration and shared state (a
/// [`RequestLocker`]), created by
/// [`LockLayerBuilder::build`]: every service it wraps (for example every route of a
/// router) locks on the same table and reports to the same metrics.
#[derive(Clone, Debug)]
pub struct LockLayer {
    locker: RequestLocker,
}

impl LockLayer {
    /// A builder locking on `engine`. Set a key extractor with
    /// [`LockLayerBuilder::key`], then [`build`](LockLayerBuilder::build).
    pub fn builder(engine: LockEngine) -> LockLayerBuilder {
        LockLayerBuilder::new(engine)
    }

    /// The idempotency preset, after the IETF Idempotency-Key draft: the key is the
    /// `Idempotency-Key` header (required: `400` when missing or malformed); a duplicate
    /// in flight is answered `409 Conflict` at once (or waits, with
    /// [`wait`](IdempotencyLayerBuilder::wait)), and a retry after completion gets the
    /// stored response replayed (`422` if its request differs); see
    /// [`idempotency`](crate::idempotency). It applies to `POST` and `PATCH` (the methods
    /// that are not idempotent by definition); other methods pass through untouched
    /// (change with [`IdempotencyLayerBuilder::methods`]).
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
    /// use tower_lock::{LockEngine, LockLayer};
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
    /// let layer = LockLayer::idempotency(LockEngine::in_memory())
    ///     .per_principal::<AccountId>()
    ///     .build()
    ///     .unwrap();
    /// # let _ = layer;
    /// ```
    pub fn idempotency(engine: LockEngine) -> IdempotencyLayerBuilder {
        IdempotencyLayerBuilder::new(
            LockLayerBuilder::new(engine)
                .on_missing_key(MissingKeyPolicy::Reject)
                .busy(RejectionKind::Conflict)
                .methods([http::Method::POST, http::Method::PATCH]),
        )
    }

    /// The idempotency preset scoped per principal:
    /// `LockLayer::idempotency(engine).per_principal::<P>()` (see
    /// [`IdempotencyLayerBuilder::per_principal`]).
    pub fn idempotency_per_principal<P>(engine: LockEngine) -> IdempotencyLayerBuilder
    where
        P: std::fmt::Display + Send + Sync + 'static,
    {
        Self::idempotency(engine).per_principal::<P>()
    }

    /// The layer's counters and histograms.
    pub fn metrics(&self) -> LockMetrics {
        self.locker.metrics()
    }

    /// The framework-neutral runtime core behind the layer: hand it to a framework
    /// integration to lock on the same table, or ask it for a lock key
    /// ([`RequestLocker::lock_key`]).
    pub fn locker(&self) -> &RequestLocker {
        &self.locker
    }
}

impl From<RequestLocker> for LockLayer {
    fn from(locker: RequestLocker) -> Self {
        LockLayer { locker }
    }
}

impl<S> Layer<S> for LockLayer {
    type Service = LockService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        // Clone the locker handle, never create state here: one layer on many services
        // must exclude across all of them.
        LockService::new(inner, self.locker.clone())
    }
}
