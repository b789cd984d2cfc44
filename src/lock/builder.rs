//! [`LockLayerBuilder`]: the configuration of a [`LockLayer`] (or a
//! [`RequestLocker`]), checked when it is built.

use std::{fmt, sync::Arc};

use super::layer::LockLayer;
use crate::{
    config_error::ConfigError,
    engine::LockEngine,
    integration::RequestLocker,
    key::KeyExtractor,
    options::ReleasePoint,
    settings::{LockSettings, lock_setters},
};

/// A [`LockLayer`] (or [`RequestLocker`]) under construction: setters consume and return the
/// builder; [`build`](Self::build) checks the configuration.
///
/// Its lock settings (everything but the [key](Self::key) and the
/// [release point](Self::release_at)) are also those of an
/// [`IdempotencyLayerBuilder`](crate::IdempotencyLayerBuilder), by the same names.
#[must_use]
pub struct LockLayerBuilder {
    engine: LockEngine,
    extractor: Option<Arc<dyn KeyExtractor>>,
    settings: LockSettings,
}

impl fmt::Debug for LockLayerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.settings;
        f.debug_struct("LockLayerBuilder")
            .field("namespace", &s.namespace)
            .field("missing", &s.missing)
            .field("ttl", &s.ttl_as_set())
            .field("wait", &s.wait_limit())
            .field("fifo", &s.options.is_fifo())
            .field("max_waiters", &s.options.waiter_limit())
            .field("backend_failure", &s.backend_failure)
            .field("release", &s.release)
            .finish_non_exhaustive()
    }
}

impl LockLayerBuilder {
    pub(crate) fn new(engine: LockEngine) -> Self {
        Self::with_settings(engine, LockSettings::new(), None)
    }

    /// A builder from settings made elsewhere (the idempotency preset without replay).
    pub(crate) fn with_settings(
        engine: LockEngine,
        settings: LockSettings,
        extractor: Option<Arc<dyn KeyExtractor>>,
    ) -> Self {
        Self {
            engine,
            extractor,
            settings,
        }
    }

    /// How to derive the lock key of a request (required). See [`crate::key`].
    pub fn key(mut self, extractor: impl KeyExtractor) -> Self {
        self.extractor = Some(Arc::new(extractor));
        self
    }

    lock_setters!();

    /// When to release the lease. Default: [`ReleasePoint::BodyEnd`]. `101 Switching
    /// Protocols` responses always release when the response is returned.
    pub fn release_at(mut self, point: ReleasePoint) -> Self {
        self.settings.release = point;
        self
    }

    /// Check the configuration and build the layer.
    pub fn build(self) -> Result<LockLayer, ConfigError> {
        self.build_locker().map(LockLayer::from)
    }

    /// Check the configuration and build the framework-neutral runtime core (for framework
    /// integrations).
    pub fn build_locker(self) -> Result<RequestLocker, ConfigError> {
        self.settings.build_locker(self.engine, self.extractor)
    }
}
