//! The in-process backend: a sharded table of keys with direct hand-off to waiters.

use std::{
    collections::{BTreeSet, HashMap, hash_map::RandomState},
    hash::BuildHasher,
    sync::{
        Arc, Mutex, MutexGuard,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use tokio::{sync::oneshot, time::Instant};

use super::{
    AcquireRequest, Backend, BoxFuture, Capabilities, ExtendMode, Fence, Grant, Holder, LockError,
    LockKey, Renewal, Token, backend::SynchronousBackend, options::after,
};

mod capabilities;
mod permits;
mod records;
mod table;
mod wait;

use permits::PermitTable;
use records::RecordStore;
use table::{Entry, HeldBy, Shard, Waiter};

const SHARDS: usize = 64;

/// The in-process backend: serializes within one process, with the same semantics as the
/// Redis backend (TTLs, fences, FIFO, waiter limits).
///
/// Release hands the key straight to the first waiter, so waiters are served in arrival
/// order and never race; a waiting task is woken exactly once, when the key is its own.
/// When nothing holds or waits for a key, its entry is removed.
pub struct MemoryBackend {
    shards: Box<[Mutex<Shard>]>,
    hasher: RandomState,
    fence: AtomicU64,
    waiter_ids: AtomicU64,
    numbers: Mutex<HashMap<LockKey, (f64, Option<Instant>)>>,
    pools: Mutex<HashMap<LockKey, BTreeSet<LockKey>>>,
    records: Mutex<RecordStore>,
    /// The permits ([`PermitBackend`](crate::PermitBackend)), kept apart from the locks.
    permits: PermitTable,
}

impl Default for MemoryBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for MemoryBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryBackend")
            .field("keys", &self.key_count())
            .finish_non_exhaustive()
    }
}

impl MemoryBackend {
    /// An empty table, keeping records ([`Lease::complete`](crate::Lease::complete)) within
    /// a budget of 64 MiB.
    pub fn new() -> Self {
        Self::with_record_budget(records::DEFAULT_BUDGET)
    }

    /// An empty table keeping at most `bytes` of records.
    ///
    /// A record is charged what it costs the process: its key, fingerprint, metadata and
    /// body, copied into one allocation, plus about 115 bytes of bookkeeping (its header,
    /// the allocator's rounding, its places in a map and a queue); a tombstone the same
    /// without metadata and body. With 100,000 small idempotency records, the process's
    /// resident memory grows within a few percent of what the budget counts
    /// (`benches/record_memory.rs`).
    ///
    /// Past the budget, the oldest completed records are evicted before their retention
    /// runs out ([`evicted_records`](Self::evicted_records) counts them), and a record
    /// larger than the whole budget is not kept; either way a *tombstone* stays for the
    /// rest of the retention (the key, the fingerprint and the completion time: a
    /// [`Record`](crate::Record) with `kept: false`), so that a retry learns that
    /// the operation completed rather than finding nothing and running it again.
    /// Tombstones count in the budget too; they are dropped, oldest first, only when no
    /// kept record is left to evict ([`evicted_tombstones`](Self::evicted_tombstones)
    /// counts those: a retry of such an operation finds nothing).
    pub fn with_record_budget(bytes: usize) -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            hasher: RandomState::new(),
            fence: AtomicU64::new(0),
            waiter_ids: AtomicU64::new(0),
            numbers: Mutex::default(),
            pools: Mutex::default(),
            records: Mutex::new(RecordStore::new(bytes)),
            permits: PermitTable::default(),
        }
    }

    /// How many records lost their output to stay within the record budget before their
    /// retention ran out (evicted, or larger than the whole budget), each leaving a
    /// tombstone.
    pub fn evicted_records(&self) -> u64 {
        self.records.lock().unwrap().evicted
    }

    /// The bytes the records and tombstones kept now are charged against the record
    /// budget (see [`with_record_budget`](Self::with_record_budget)).
    pub fn record_bytes(&self) -> usize {
        self.records.lock().unwrap().bytes()
    }

    /// How many tombstones were dropped to stay within the record budget before their
    /// retention ran out (only when no kept record was left to evict). Anything above
    /// zero means the budget is too small for the retention: a retry of those operations
    /// finds nothing, and runs again.
    pub fn evicted_tombstones(&self) -> u64 {
        self.records.lock().unwrap().evicted_tombstones
    }

    /// How many keys have an entry (held, or waited for, or expired and not yet swept),
    /// counting numeric values, pools, records and tombstones within their retention, and
    /// keys whose permits are held or waited for.
    pub fn key_count(&self) -> usize {
        let now = Instant::now();
        let locks: usize = self
            .shards
            .iter()
            .map(|s| s.lock().unwrap().map.len())
            .sum();
        let numbers = {
            let mut numbers = self.numbers.lock().unwrap();
            numbers.retain(|_, (_, exp)| exp.is_none_or(|e| e > now));
            numbers.len()
        };
        let records = self.records.lock().unwrap().live(now);
        let permits = self.permits.key_count();
        locks + numbers + self.pools.lock().unwrap().len() + records + permits
    }

    /// The members of `pool`, sorted (a copy: the pool lock is not held while the
    /// members' holders are read).
    fn members(&self, pool: &LockKey) -> Vec<LockKey> {
        let pools = self.pools.lock().unwrap();
        pools
            .get(pool)
            .map(|m| m.iter().cloned().collect())
            .unwrap_or_default()
    }

    fn holder_now(&self, key: &LockKey) -> Option<Holder> {
        let mut shard = self.shard(key);
        let now = Instant::now();
        let entry = shard.map.get_mut(key)?;
        entry.expire(now, self);
        let holder = entry.holder.as_ref().map(|h| {
            Holder::new(
                h.token.clone(),
                h.expires.map(|e| e.saturating_duration_since(now)),
            )
        });
        shard.remove_if_empty(key);
        holder
    }

    fn shard(&self, key: &LockKey) -> MutexGuard<'_, Shard> {
        let i = self.hasher.hash_one(key) as usize % SHARDS;
        self.shards[i].lock().unwrap()
    }

    fn next_fence(&self) -> Fence {
        Fence::new(self.fence.fetch_add(1, Ordering::Relaxed) + 1)
    }
}

/// Removes a waiter whose acquire future is dropped, or gives back a grant it never saw.
struct WaitGuard<'a> {
    backend: &'a MemoryBackend,
    key: &'a LockKey,
    token: &'a Token,
    id: u64,
    rx: Option<oneshot::Receiver<Grant>>,
}

impl wait::Queued for WaitGuard<'_> {
    fn receiver(&mut self) -> &mut Option<oneshot::Receiver<Grant>> {
        &mut self.rx
    }
}

impl Drop for WaitGuard<'_> {
    fn drop(&mut self) {
        let Some(mut rx) = self.rx.take() else {
            return;
        };
        let mut shard = self.backend.shard(self.key);
        let now = Instant::now();
        if let Some(entry) = shard.map.get_mut(self.key) {
            if let Some(pos) = entry.waiters.iter().position(|w| w.id == self.id) {
                entry.waiters.remove(pos);
            } else if let Ok(grant) = rx.try_recv() {
                // Granted before we got here. Give the key to the next in line only if
                // that grant still holds it: it may have run out, or been forced free,
                // and the key passed on to someone else whom we must not touch.
                entry.expire(now, self.backend);
                let ours = entry
                    .holder
                    .as_ref()
                    .is_some_and(|h| h.token == *self.token && h.fence == grant.fence.get());
                if ours {
                    entry.holder = None;
                    entry.grant_next(now, self.backend);
                }
            }
        }
        shard.remove_if_empty(self.key);
    }
}

impl MemoryBackend {
    /// Release `key` if `token` holds it, running `before` (with the current time) while
    /// the key is still held and its shard locked, then hand it to the next waiter.
    fn release_then(
        &self,
        key: &LockKey,
        token: &Token,
        before: impl FnOnce(Instant),
    ) -> Result<(), LockError> {
        let mut shard = self.shard(key);
        let now = Instant::now();
        let Some(entry) = shard.map.get_mut(key) else {
            return Err(LockError::Expired);
        };
        entry.expire(now, self);
        let result = match &entry.holder {
            Some(h) if h.token == *token => {
                before(now);
                entry.holder = None;
                entry.grant_next(now, self);
                Ok(())
            }
            Some(_) => Err(LockError::NotOwned),
            None => Err(LockError::Expired),
        };
        shard.remove_if_empty(key);
        result
    }

    /// Decide `req` on `entry` (its shard locked) without waiting: granted, or refused
    /// at once; `None` when it has to queue. Shared by the synchronous path
    /// ([`SynchronousBackend::acquire_now`]) and [`Backend::acquire`], so both decide alike.
    fn decide(
        &self,
        entry: &mut Entry,
        req: &AcquireRequest,
        now: Instant,
    ) -> Option<Result<Grant, LockError>> {
        entry.expire(now, self);
        match &mut entry.holder {
            None => {
                let fence = self.next_fence();
                entry.set_holder(HeldBy {
                    token: req.token.clone(),
                    expires: Some(after(now, req.ttl)),
                    fence: fence.get(),
                });
                return Some(Ok(Grant::new(fence, now)));
            }
            Some(h) if h.token == req.token => {
                let expires = Some(after(now, req.ttl));
                h.expires = expires;
                let fence = Fence::new(h.fence);
                entry.expiry_changed(expires);
                return Some(Ok(Grant::new(fence, now)));
            }
            Some(_) => {}
        }
        let retry_after = entry.remaining(now);
        if req.wait == Some(Duration::ZERO) {
            return Some(Err(LockError::Busy { retry_after }));
        }
        if req
            .max_waiters
            .is_some_and(|max| entry.waiters.len() >= max)
        {
            return Some(Err(LockError::QueueFull { retry_after }));
        }
        None
    }

    async fn acquire_inner(&self, req: AcquireRequest) -> Result<Grant, LockError> {
        let started = Instant::now();
        let (rx, id, changed) = {
            let mut shard = self.shard(&req.key);
            // One clock read serves: a lease that starts a moment early only ends early.
            let now = started;
            shard.sweep(now);
            let entry = shard.map.entry(req.key.clone()).or_default();
            if let Some(decided) = self.decide(entry, &req, now) {
                return decided;
            }
            let (tx, rx) = oneshot::channel();
            let id = self.waiter_ids.fetch_add(1, Ordering::Relaxed);
            entry.waiters.push_back(Waiter {
                id,
                token: req.token.clone(),
                ttl: req.ttl,
                grant: tx,
            });
            let changed = entry.changed.get_or_insert_with(Arc::default).clone();
            (rx, id, changed)
        };
        let guard = WaitGuard {
            backend: self,
            key: &req.key,
            token: &req.token,
            id,
            rx: Some(rx),
        };
        let table = wait::Table {
            // Expiring the holder (if its TTL ran out) grants the head waiter.
            expire: || {
                let mut shard = self.shard(&req.key);
                shard.map.get_mut(&req.key).and_then(|entry| {
                    entry.expire(Instant::now(), self);
                    entry.holder.as_ref().and_then(|h| h.expires)
                })
            },
            remaining: || {
                let shard = self.shard(&req.key);
                shard
                    .map
                    .get(&req.key)
                    .and_then(|e| e.remaining(Instant::now()))
            },
        };
        wait::for_grant(guard, changed, started, req.wait, table).await
    }
}

impl Backend for MemoryBackend {
    fn acquire(&self, req: AcquireRequest) -> BoxFuture<'_, Result<Grant, LockError>> {
        Box::pin(self.acquire_inner(req))
    }

    fn release<'a>(
        &'a self,
        key: &'a LockKey,
        token: &'a Token,
    ) -> BoxFuture<'a, Result<(), LockError>> {
        Box::pin(async move { self.release_then(key, token, |_| {}) })
    }

    fn extend<'a>(
        &'a self,
        key: &'a LockKey,
        token: &'a Token,
        ttl: Duration,
        mode: ExtendMode,
    ) -> BoxFuture<'a, Result<Duration, LockError>> {
        Box::pin(async move {
            let mut shard = self.shard(key);
            let now = Instant::now();
            let Some(entry) = shard.map.get_mut(key) else {
                return Err(LockError::Expired);
            };
            entry.expire(now, self);
            let result = match &mut entry.holder {
                Some(h) if h.token == *token => {
                    let expires = match (mode, h.expires) {
                        (ExtendMode::Add, Some(e)) => after(e, ttl),
                        (ExtendMode::Add, None) => return Ok(Duration::MAX),
                        (ExtendMode::Replace, _) => after(now, ttl),
                    };
                    h.expires = Some(expires);
                    entry.expiry_changed(Some(expires));
                    Ok(expires - now)
                }
                Some(_) => Err(LockError::NotOwned),
                None => Err(LockError::Expired),
            };
            shard.remove_if_empty(key);
            result
        })
    }

    fn renew<'a>(&'a self, leases: &'a [Renewal]) -> BoxFuture<'a, Result<Vec<bool>, LockError>> {
        Box::pin(async move {
            Ok(leases
                .iter()
                .map(|r| {
                    let mut shard = self.shard(&r.key);
                    let now = Instant::now();
                    let Some(entry) = shard.map.get_mut(&r.key) else {
                        return false;
                    };
                    entry.expire(now, self);
                    let ok = match &mut entry.holder {
                        Some(h) if h.token == r.token => {
                            // A renewal never shortens a lease: one that lands after an
                            // extend must not undo it.
                            if let Some(e) = h.expires {
                                let expires = e.max(after(now, r.ttl));
                                h.expires = Some(expires);
                                entry.expiry_changed(Some(expires));
                            }
                            true
                        }
                        _ => false,
                    };
                    shard.remove_if_empty(&r.key);
                    ok
                })
                .collect())
        })
    }

    fn holder<'a>(&'a self, key: &'a LockKey) -> BoxFuture<'a, Result<Option<Holder>, LockError>> {
        Box::pin(async move { Ok(self.holder_now(key)) })
    }

    fn waiters<'a>(&'a self, key: &'a LockKey) -> BoxFuture<'a, Result<usize, LockError>> {
        Box::pin(async move {
            let shard = self.shard(key);
            Ok(shard.map.get(key).map_or(0, |e| e.waiters.len()))
        })
    }

    fn capabilities(&self) -> Capabilities<'_> {
        Capabilities::none()
            .with_admin(self)
            .with_numeric(self)
            .with_pools(self)
            .with_records(self)
            .with_permits(self)
    }
}

impl SynchronousBackend for MemoryBackend {
    fn acquire_now(&self, req: &AcquireRequest, now: Instant) -> Option<Result<Grant, LockError>> {
        let mut shard = self.shard(&req.key);
        shard.sweep(now);
        let entry = shard.map.entry(req.key.clone()).or_default();
        // Undecided means another token holds the key, so the entry stays non-empty.
        self.decide(entry, req, now)
    }

    fn release_now(&self, key: &LockKey, token: &Token) -> Result<(), LockError> {
        self.release_then(key, token, |_| {})
    }
}
