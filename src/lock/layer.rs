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

use super::{builder::LockLayerBuilder, service::LockService};
use tower_lock_core::RequestLocker;

use crate::{engine::LockEngine, metrics::LockMetrics};

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
    /// [`LockLayerBuilder::key`], then [`build`](LockLayerBuilder::build). (Idempotency
    /// with replay has a layer of its own:
    /// [`IdempotencyLayer::builder`](crate::IdempotencyLayer::builder).)
    pub fn builder(engine: LockEngine) -> LockLayerBuilder {
        LockLayerBuilder::new(engine)
    }

    pub(crate) fn new(locker: RequestLocker) -> Self {
        Self { locker }
    }

    /// The layer's counters and histograms.
    pub fn metrics(&self) -> LockMetrics {
        self.locker.metrics()
    }

    /// The framework-neutral runtime core behind the layer: hand it to a framework
    /// integration to lock on the same table, or ask it for a lock key
    /// ([`RequestLocker::key_for`]).
    pub fn locker(&self) -> &RequestLocker {
        &self.locker
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
