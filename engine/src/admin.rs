//! [`LockAdmin`]: administrative operations that ignore ownership.

use std::time::Duration;

use super::{Fence, LockEngine, LockError, LockKey, Token, options::check_ttl};

/// Operations that ignore ownership. Every call is logged at `warn`. Backends without the
/// admin capability answer [`LockError::Unsupported`].
///
/// ```
/// use std::time::Duration;
/// use tower_lock_engine::{LockEngine, LockStatus, Token};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tower_lock_engine::LockError> {
/// let engine = LockEngine::in_memory();
/// // Take the printer out of service for an hour.
/// let maintenance = Token::new("maintenance").unwrap();
/// engine.admin().set("printer", &maintenance, Some(Duration::from_secs(3600))).await?;
/// let status = engine.lock("printer").ttl(Duration::from_secs(30)).status().await?;
/// assert!(matches!(status, LockStatus::Reserved { .. }));
/// assert!(engine.admin().force_release("printer").await?);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct LockAdmin {
    engine: LockEngine,
}

impl LockAdmin {
    pub(crate) fn new(engine: LockEngine) -> Self {
        Self { engine }
    }

    /// Make `value` the holder of `key` for `ttl` (`None`: no expiry), whoever holds it.
    pub async fn set(
        &self,
        key: impl AsRef<str>,
        value: &Token,
        ttl: Option<Duration>,
    ) -> Result<(), LockError> {
        let key = LockKey::new(key)?;
        tracing::warn!(%key, ?ttl, "admin: setting lock holder");
        if let Some(ttl) = ttl {
            check_ttl(ttl)?;
        }
        self.engine
            .admin_backend()?
            .admin_set(&key, value, ttl)
            .await
    }

    /// Release `key` whoever holds it; the next waiter gets it. Returns whether it was held.
    pub async fn force_release(&self, key: impl AsRef<str>) -> Result<bool, LockError> {
        let key = LockKey::new(key)?;
        tracing::warn!(%key, "admin: force-releasing lock");
        self.engine.admin_backend()?.force_release(&key).await
    }

    /// The highest fence the store remembers for `key`, held or not (see
    /// [`AdminBackend::last_fence`](super::AdminBackend::last_fence)): what a storage
    /// system's high-water mark for `key` should be at most, and what the next grant
    /// exceeds.
    pub async fn last_fence(&self, key: impl AsRef<str>) -> Result<Option<Fence>, LockError> {
        let key = LockKey::new(key)?;
        self.engine.admin_backend()?.last_fence(&key).await
    }

    /// Up to `limit` keys someone holds or waits for, in key order, after `after` (the
    /// last key of the page before) and beginning with `starts_with`: a page of what
    /// `tower-lock-cli list` shows. [`LockError::Unsupported`] where the backend has no
    /// such listing (see [`AdminBackend::active_keys`](super::AdminBackend::active_keys)).
    pub async fn active_keys(
        &self,
        after: Option<&LockKey>,
        starts_with: &str,
        limit: usize,
    ) -> Result<Vec<ActiveKey>, LockError> {
        self.engine
            .admin_backend()?
            .active_keys(after, starts_with, limit)
            .await
    }
}

/// A key someone holds or waits for, as [`AdminBackend::active_keys`](super::AdminBackend::active_keys) lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ActiveKey {
    /// The key.
    pub key: LockKey,
    /// Someone holds it (in either mode).
    pub held: bool,
    /// Someone may wait for it (a queue is there; its tickets may have lapsed).
    pub waiting: bool,
}

impl ActiveKey {
    /// `key`, held or not, waited for or not.
    pub fn new(key: LockKey, held: bool, waiting: bool) -> Self {
        Self { key, held, waiting }
    }
}
