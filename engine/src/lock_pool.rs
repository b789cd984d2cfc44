//! [`LockPool`]: a named set of lock keys with membership and health operations.

use std::time::Duration;

use super::{KeyError, LockEngine, LockError, LockKey, LockStatus};

/// A change to a pool's members, applied atomically.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PoolOp {
    /// Add these keys.
    Add(Vec<LockKey>),
    /// Remove these keys.
    Remove(Vec<LockKey>),
    /// Replace all members with these keys.
    Replace(Vec<LockKey>),
    /// Remove every member.
    Clear,
}

/// How many members of a pool are held and free.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct PoolHealth {
    /// Members held by someone (locked, unavailable, or without expiry).
    pub locked: usize,
    /// Members nobody holds.
    pub free: usize,
}

/// A named set of lock keys, e.g. the workers or printers of a fleet, with the lock status
/// of every member in one round trip.
///
/// Pool membership is data the user manages: it stays until removed or cleared (a pool
/// that becomes empty leaves nothing behind).
///
/// ```
/// use tower_lock_engine::LockEngine;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tower_lock_engine::LockError> {
/// let engine = LockEngine::in_memory();
/// let printers = engine.pool("printers");
/// printers.add(["printer:1", "printer:2"]).await?;
/// let job = engine.lock("printer:1").acquire().await?;
/// let health = printers.health().await?;
/// assert_eq!((health.locked, health.free), (1, 1));
/// job.release().await?;
/// printers.clear().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct LockPool {
    engine: LockEngine,
    name: Result<LockKey, KeyError>,
    expected_ttl: Duration,
}

impl LockPool {
    pub(crate) fn new(engine: LockEngine, name: Result<LockKey, KeyError>) -> Self {
        Self {
            engine,
            name,
            expected_ttl: super::LockOptions::default().ttl,
        }
    }

    /// The TTL members are expected to be held with; longer TTLs report as
    /// [`LockStatus::Reserved`]. Default: the default lease TTL.
    pub fn expected_ttl(mut self, ttl: Duration) -> Self {
        self.expected_ttl = ttl;
        self
    }

    fn name(&self) -> Result<&LockKey, LockError> {
        self.name
            .as_ref()
            .map_err(|e| LockError::InvalidKey(e.clone()))
    }

    async fn modify(&self, op: PoolOp) -> Result<usize, LockError> {
        self.engine
            .pool_backend()?
            .pool_modify(self.name()?, &op)
            .await
    }

    /// Add keys; returns the new size.
    pub async fn add<K: AsRef<str>>(
        &self,
        keys: impl IntoIterator<Item = K>,
    ) -> Result<usize, LockError> {
        self.modify(PoolOp::Add(keys_of(keys)?)).await
    }

    /// Remove keys; returns the new size.
    pub async fn remove<K: AsRef<str>>(
        &self,
        keys: impl IntoIterator<Item = K>,
    ) -> Result<usize, LockError> {
        self.modify(PoolOp::Remove(keys_of(keys)?)).await
    }

    /// Replace all members at once; returns the new size.
    pub async fn replace<K: AsRef<str>>(
        &self,
        keys: impl IntoIterator<Item = K>,
    ) -> Result<usize, LockError> {
        self.modify(PoolOp::Replace(keys_of(keys)?)).await
    }

    /// Remove every member.
    pub async fn clear(&self) -> Result<(), LockError> {
        self.modify(PoolOp::Clear).await.map(drop)
    }

    /// The members, sorted.
    pub async fn members(&self) -> Result<Vec<LockKey>, LockError> {
        self.engine.pool_backend()?.pool_members(self.name()?).await
    }

    /// Whether `key` is a member.
    pub async fn contains(&self, key: impl AsRef<str>) -> Result<bool, LockError> {
        let key = LockKey::new(key)?;
        Ok(self.members().await?.contains(&key))
    }

    /// How many members the pool has.
    pub async fn len(&self) -> Result<usize, LockError> {
        Ok(self.members().await?.len())
    }

    /// Whether the pool has no members.
    pub async fn is_empty(&self) -> Result<bool, LockError> {
        Ok(self.members().await?.is_empty())
    }

    /// The lock status of every member, read in one round trip.
    pub async fn statuses(&self) -> Result<Vec<(LockKey, LockStatus)>, LockError> {
        let holders = self
            .engine
            .pool_backend()?
            .pool_holders(self.name()?)
            .await?;
        Ok(holders
            .into_iter()
            .map(|(k, h)| (k, LockStatus::from_holder(h, self.expected_ttl)))
            .collect())
    }

    /// Counts of held and free members.
    pub async fn health(&self) -> Result<PoolHealth, LockError> {
        let mut health = PoolHealth::default();
        for (_, status) in self.statuses().await? {
            if status.is_held() {
                health.locked += 1;
            } else {
                health.free += 1;
            }
        }
        Ok(health)
    }
}

fn keys_of<K: AsRef<str>>(keys: impl IntoIterator<Item = K>) -> Result<Vec<LockKey>, LockError> {
    keys.into_iter()
        .map(|k| LockKey::new(k).map_err(LockError::from))
        .collect()
}
