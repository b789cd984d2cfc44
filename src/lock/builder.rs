//! [`LockLayerBuilder`]: the configuration of a [`LockLayer`] (or a
//! [`RequestLocker`]), checked when it is built.

use std::{fmt, sync::Arc};

use super::layer::LockLayer;
use tower_lock_core::{RequestLocker, settings::LockSettings};

use crate::{
    ConfigError, ReleasePoint, engine::LockEngine, key::KeyExtractor, setters::lock_setters,
};

/// A [`LockLayer`] (or [`RequestLocker`]) under construction: setters consume and return the
/// builder; [`build`](Self::build) checks the configuration.
///
/// Its lock settings (everything but the [key](Self::key), the
/// [release point](Self::release_at) and the [permits](Self::permits)) are also those of an
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
            .field("permits", &s.permits)
            .field("shared_for", &s.shared_for)
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

    /// Admit up to `n` requests per key at once instead of one: a keyed concurrency limit
    /// (at most `n` requests per tenant in flight). Each locked request takes one of the
    /// key's `n` permits, a lease like the lock's (fence, renewal, `lost()`, release when
    /// the body ends); the others wait (`wait`, `fifo`, `max_waiters`) or are answered
    /// `423`/`429` as for the lock. With [`shared_for`](Self::shared_for), `n` bounds the
    /// requests that share a key; the other methods take it alone.
    ///
    /// Without [`methods`](Self::methods), a layer with permits limits `GET` and `HEAD`
    /// too (an export, a report), unlike the lock's default: only `OPTIONS` (a CORS
    /// preflight) and `TRACE` pass unlimited.
    ///
    /// At least 1, or `build` fails
    /// ([`ConfigError::ZeroPermits`](crate::ConfigError::ZeroPermits)). Default: no
    /// permits, the lock (one request per key; and the fastest path). Permits are the
    /// engine's shared leases of the key, which the key's lock excludes: a background job
    /// holding [`LockEngine::lock_on`](crate::LockEngine::lock_on)`(key)` on the layer's
    /// [`key_for`](crate::RequestLocker::key_for) runs beside none of this
    /// layer's requests. Not
    /// offered under idempotency, whose duplicates must never run at once (`build` of
    /// [`without_replay`](crate::IdempotencyLayerBuilder::without_replay) refuses it,
    /// [`ConfigError::IdempotencyPermits`](crate::ConfigError::IdempotencyPermits)).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_lock::{LockEngine, LockLayer, key::HeaderKey};
    ///
    /// // At most 4 requests per tenant at once; more wait up to 2 s in arrival order.
    /// let layer = LockLayer::builder(LockEngine::in_memory())
    ///     .key(HeaderKey::new("x-tenant-id"))
    ///     .permits(4)
    ///     .wait(Duration::from_secs(2))
    ///     .fifo(true)
    ///     .build()
    ///     .unwrap();
    /// # let _ = layer;
    /// ```
    pub fn permits(mut self, n: u32) -> Self {
        self.settings.permits = Some(n);
        self
    }

    /// Let requests with these methods share a key, while every other locked method takes
    /// it alone: readers beside readers, a writer alone (a read-write lock per key).
    /// Without [`permits`](Self::permits) any number of shared requests run at once; with
    /// it, at most that many.
    ///
    /// These methods are locked (shared) whatever [`methods`](Self::methods) says: with the
    /// default methods, `shared_for(["GET", "HEAD"])` locks `GET` and `HEAD` as shared and
    /// `POST`, `PUT`, `PATCH`, `DELETE` (and extension methods) as exclusive, while
    /// `OPTIONS` and `TRACE` still pass unlocked. Naming `GET` names `HEAD` too (as for
    /// `methods`): `shared_for(["GET"])` locks a `HEAD`, which runs the `GET` handler, as
    /// a shared read.
    ///
    /// Grants keep arrival order: a request is granted on arrival only when nobody waits,
    /// so once a writer waits, readers arriving after it queue behind it and a steady
    /// stream of readers never starves it. Every grant, shared or exclusive, gets a fence
    /// greater than every earlier one on the key. A shared request that finds a writer
    /// holding or waiting is answered as contention always is (`423` at once, or a wait,
    /// then `429`).
    ///
    /// Methods are named as for [`methods`](Self::methods) (text or `Method`); `build`
    /// refuses an empty list
    /// ([`ConfigError::NoSharedMethods`](crate::ConfigError::NoSharedMethods)) and a name
    /// that is not a method.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_lock::{LockEngine, LockLayer, http::Method, key::PathKey};
    ///
    /// // Reads of a document run side by side; a write waits for them and runs alone.
    /// let layer = LockLayer::builder(LockEngine::in_memory())
    ///     .key(PathKey)
    ///     .shared_for([Method::GET, Method::HEAD])
    ///     .wait(Duration::from_secs(5))
    ///     .build()
    ///     .unwrap();
    /// assert!(layer.locker().locks_method("GET"));
    /// # let _ = layer;
    /// ```
    pub fn shared_for<M: AsRef<str>>(mut self, methods: impl IntoIterator<Item = M>) -> Self {
        self.settings.shared_for(methods);
        self
    }

    /// When to release the lease. Default: [`ReleasePoint::BodyEnd`]. `101 Switching
    /// Protocols` responses always release when the response is returned.
    pub fn release_at(mut self, point: ReleasePoint) -> Self {
        self.settings.release = point;
        self
    }

    /// Check the configuration and build the layer.
    pub fn build(self) -> Result<LockLayer, ConfigError> {
        self.build_locker().map(LockLayer::new)
    }

    /// Check the configuration and build the framework-neutral runtime core (for framework
    /// integrations).
    pub fn build_locker(self) -> Result<RequestLocker, ConfigError> {
        self.settings.build_locker(self.engine, self.extractor)
    }
}
