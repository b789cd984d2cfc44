//! The in-process backend's permits ([`PermitBackend`]): N shared holders or one exclusive
//! holder per key, kept apart from the locks, with a queue granted from its head as many as
//! fit and direct hand-off to the waiters.
//!
//! Nobody polls. A release (or a dropped waiter) grants the waiters that now fit on the
//! spot, through their oneshot channels. A holder whose lease runs out is dropped by the
//! waiters themselves: each sleeps until the earliest holder expiry (and is told when that
//! moves earlier), then expires what ran out, which grants the head of the queue. With
//! nobody waiting, an expired holder is dropped at the next call on its key, or by a sweep.

use std::{
    sync::{Arc, Mutex, MutexGuard, atomic::Ordering},
    time::Duration,
};

use tokio::{sync::oneshot, time::Instant};

use self::table::{Holding, PermitShard, PermitWaiter};
use super::{MemoryBackend, SHARDS, wait};
use crate::{
    BoxFuture, ExtendMode, Grant, LockError, LockKey, PermitBackend, PermitHolder, PermitRequest,
    Renewal, Token, options::after,
};

mod table;

/// The permits of every key, sharded; the shard of a key is picked by the backend's hasher.
pub(super) struct PermitTable {
    shards: Box<[Mutex<PermitShard>]>,
}

impl Default for PermitTable {
    fn default() -> Self {
        Self {
            shards: (0..SHARDS)
                .map(|_| Mutex::new(PermitShard::default()))
                .collect(),
        }
    }
}

impl PermitTable {
    /// How many keys have an entry: permits held, or waited for, or held by leases that
    /// ran out and were not yet swept.
    pub(super) fn key_count(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap().map.len())
            .sum()
    }
}

impl MemoryBackend {
    fn permit_shard(&self, key: &LockKey) -> MutexGuard<'_, PermitShard> {
        let i = std::hash::BuildHasher::hash_one(&self.hasher, key) as usize % SHARDS;
        self.permits.shards[i].lock().unwrap()
    }

    async fn acquire_permit_inner(&self, req: PermitRequest) -> Result<Grant, LockError> {
        let PermitRequest {
            acquire: req,
            permits,
            exclusive,
        } = req;
        if permits == 0 {
            return Err(LockError::InvalidValue("permits must be at least 1"));
        }
        let started = Instant::now();
        let (rx, id, changed) = {
            let mut shard = self.permit_shard(&req.key);
            // One clock read serves: a lease that starts a moment early only ends early.
            let now = started;
            shard.sweep(now);
            let entry = shard.map.entry(req.key.clone()).or_default();
            entry.expire(now, self);
            // Re-entry: the token's holding, refreshed, with its fence.
            if let Some(held) = entry.holding(&req.token) {
                if exclusive && !held.exclusive {
                    return Err(LockError::InvalidValue(
                        "a shared permit cannot be re-entered as exclusive",
                    ));
                }
                entry.set_expiry(&req.token, after(now, req.ttl));
                return Ok(Grant::new(crate::Fence::new(held.fence), now));
            }
            // Granted on arrival only when nobody waits: no newcomer overtakes the queue.
            if entry.waiters.is_empty() && entry.fits(permits, exclusive) {
                let fence = self.next_fence();
                entry.insert(
                    req.token.clone(),
                    Holding {
                        expires: after(now, req.ttl),
                        exclusive,
                        fence: fence.get(),
                    },
                );
                return Ok(Grant::new(fence, now));
            }
            // Refused or queued: someone holds or waits, so the entry stays.
            let retry_after = entry.remaining(now);
            if req.wait == Some(Duration::ZERO) {
                return Err(LockError::Busy { retry_after });
            }
            if req
                .max_waiters
                .is_some_and(|max| entry.waiters.len() >= max)
            {
                return Err(LockError::QueueFull { retry_after });
            }
            let (tx, rx) = oneshot::channel();
            let id = self.waiter_ids.fetch_add(1, Ordering::Relaxed);
            entry.waiters.push_back(PermitWaiter {
                id,
                token: req.token.clone(),
                ttl: req.ttl,
                permits,
                exclusive,
                grant: tx,
            });
            let changed = entry.changed.get_or_insert_with(Arc::default).clone();
            (rx, id, changed)
        };
        let guard = PermitWaitGuard {
            backend: self,
            key: &req.key,
            token: &req.token,
            id,
            rx: Some(rx),
        };
        let table = wait::Table {
            // Expiring holders whose TTL ran out grants the waiters that now fit.
            expire: || {
                let mut shard = self.permit_shard(&req.key);
                shard.map.get_mut(&req.key).and_then(|entry| {
                    entry.expire(Instant::now(), self);
                    entry.earliest()
                })
            },
            remaining: || {
                let shard = self.permit_shard(&req.key);
                shard
                    .map
                    .get(&req.key)
                    .and_then(|e| e.remaining(Instant::now()))
            },
        };
        wait::for_grant(guard, changed, started, req.wait, table).await
    }

    /// Run `change` on `key`'s entry (its expired holders dropped first), then drop the
    /// entry if nothing is left; [`LockError::Expired`] if there is no entry.
    fn with_permits<T>(
        &self,
        key: &LockKey,
        change: impl FnOnce(&mut table::PermitEntry, Instant) -> Result<T, LockError>,
    ) -> Result<T, LockError> {
        let mut shard = self.permit_shard(key);
        let now = Instant::now();
        let Some(entry) = shard.map.get_mut(key) else {
            return Err(LockError::Expired);
        };
        entry.expire(now, self);
        let result = change(entry, now);
        shard.remove_if_empty(key);
        result
    }
}

/// Removes a waiter whose acquire future is dropped, or gives back a grant it never saw;
/// either way the waiters that now fit are granted.
struct PermitWaitGuard<'a> {
    backend: &'a MemoryBackend,
    key: &'a LockKey,
    token: &'a Token,
    id: u64,
    rx: Option<oneshot::Receiver<Grant>>,
}

impl wait::Queued for PermitWaitGuard<'_> {
    fn receiver(&mut self) -> &mut Option<oneshot::Receiver<Grant>> {
        &mut self.rx
    }
}

impl Drop for PermitWaitGuard<'_> {
    fn drop(&mut self) {
        let Some(mut rx) = self.rx.take() else {
            return;
        };
        let mut shard = self.backend.permit_shard(self.key);
        let now = Instant::now();
        if let Some(entry) = shard.map.get_mut(self.key) {
            entry.expire(now, self.backend);
            if let Some(pos) = entry.waiters.iter().position(|w| w.id == self.id) {
                entry.waiters.remove(pos);
            } else if let Ok(grant) = rx.try_recv() {
                // Granted before we got here. Give the permit back only if that grant
                // still holds it: it may have run out and the token's place been taken.
                if entry
                    .holding(self.token)
                    .is_some_and(|h| h.fence == grant.fence.get())
                {
                    entry.remove(self.token);
                }
            }
            // The one who left may have been the head that did not fit.
            entry.grant_waiters(now, self.backend);
        }
        shard.remove_if_empty(self.key);
    }
}

impl PermitBackend for MemoryBackend {
    fn acquire_permit(&self, req: PermitRequest) -> BoxFuture<'_, Result<Grant, LockError>> {
        Box::pin(self.acquire_permit_inner(req))
    }

    fn release_permit<'a>(
        &'a self,
        key: &'a LockKey,
        token: &'a Token,
    ) -> BoxFuture<'a, Result<(), LockError>> {
        Box::pin(async move {
            self.with_permits(key, |entry, now| {
                if entry.remove(token).is_some() {
                    entry.grant_waiters(now, self);
                    Ok(())
                } else if entry.is_held() {
                    Err(LockError::NotOwned)
                } else {
                    Err(LockError::Expired)
                }
            })
        })
    }

    fn extend_permit<'a>(
        &'a self,
        key: &'a LockKey,
        token: &'a Token,
        ttl: Duration,
        mode: ExtendMode,
    ) -> BoxFuture<'a, Result<Duration, LockError>> {
        Box::pin(async move {
            self.with_permits(key, |entry, now| {
                let Some(held) = entry.holding(token) else {
                    return Err(if entry.is_held() {
                        LockError::NotOwned
                    } else {
                        LockError::Expired
                    });
                };
                let expires = match mode {
                    ExtendMode::Add => after(held.expires, ttl),
                    ExtendMode::Replace => after(now, ttl),
                };
                entry.set_expiry(token, expires);
                Ok(expires - now)
            })
        })
    }

    fn renew_permits<'a>(
        &'a self,
        leases: &'a [Renewal],
    ) -> BoxFuture<'a, Result<Vec<bool>, LockError>> {
        Box::pin(async move {
            Ok(leases
                .iter()
                .map(|r| {
                    self.with_permits(&r.key, |entry, now| {
                        Ok(entry.holding(&r.token).is_some_and(|held| {
                            // A renewal never shortens a lease: one that lands after an
                            // extend must not undo it.
                            entry.set_expiry(&r.token, held.expires.max(after(now, r.ttl)))
                        }))
                    })
                    .unwrap_or(false)
                })
                .collect())
        })
    }

    fn permit_holders<'a>(
        &'a self,
        key: &'a LockKey,
    ) -> BoxFuture<'a, Result<Vec<PermitHolder>, LockError>> {
        Box::pin(async move {
            Ok(self
                .with_permits(key, |entry, now| Ok(entry.holders(now)))
                .unwrap_or_default())
        })
    }

    fn permit_waiters<'a>(&'a self, key: &'a LockKey) -> BoxFuture<'a, Result<usize, LockError>> {
        Box::pin(async move {
            let shard = self.permit_shard(key);
            Ok(shard.map.get(key).map_or(0, |e| e.waiters.len()))
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::{LockEngine, LockError};

    #[tokio::test]
    async fn a_shared_permit_is_not_upgraded_to_exclusive() {
        let engine = LockEngine::in_memory();
        let doc = engine.permits("doc", 4);
        let reader = doc.acquire().await.unwrap();
        let upgrade = doc.clone().exclusive().token(reader.token().clone());
        assert!(matches!(
            upgrade.try_acquire().await,
            Err(LockError::InvalidValue(_))
        ));
        // An exclusive holder asking again as shared re-enters what it holds.
        reader.release().await.unwrap();
        let writer = doc.clone().exclusive().acquire().await.unwrap();
        let again = doc.clone().token(writer.token().clone()).acquire().await;
        assert_eq!(again.unwrap().fence(), writer.fence());
        let holders = doc.holders().await.unwrap();
        assert!(holders.len() <= 1 && holders.iter().all(|h| h.exclusive));
    }
}
