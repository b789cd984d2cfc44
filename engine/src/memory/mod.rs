//! The in-process backend: a sharded table of keys, each one space for both modes, with
//! direct hand-off to waiters.

use std::{
    collections::{BTreeSet, HashMap},
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use tokio::{sync::oneshot, time::Instant};

use super::{
    AcquireRequest, Backend, BoxFuture, Capabilities, ExtendMode, Fence, Grant, Holder, LockError,
    LockKey, Mode, Renewal, Resets, Token, backend::SynchronousBackend,
};

mod capabilities;
mod holders;
mod numbers;
mod records;
mod space;
mod table;
mod wait;

use numbers::Numbers;
use records::RecordStore;
use space::Waiter;
use table::Table;
use wait::WaitGuard;

/// How long a key handed to a waiter is held for it until its lease takes it (the lease
/// then renews it to its full TTL, at a third of this): a waiter whose runtime is blocked,
/// and so never takes its grant, keeps the key from the waiters behind it this long, not
/// for its whole lease. Redis's hand-offs carry a claim period of the same purpose.
const HANDOFF_CLAIM: std::time::Duration = std::time::Duration::from_secs(3);

/// A hand-off's claim for a waiter whose lease is `ttl`, and the grant that carries it.
fn handed_off(fence: Fence, now: Instant, ttl: std::time::Duration) -> (Grant, Instant) {
    let claim = ttl.min(HANDOFF_CLAIM);
    (
        Grant::new(fence, now).valid_for(claim),
        crate::options::after(now, claim),
    )
}

/// The in-process backend: serializes within one process, with the same semantics as the
/// other backends (TTLs, fences, FIFO, waiter limits), in both modes: a key's lock and its
/// shared leases are one space, with one queue (see [`Mode`]).
///
/// Release hands the key straight to the first waiter, so waiters are served in arrival
/// order and never race; a waiting task is woken exactly once, when the key is its own.
/// When nothing holds or waits for a key, its entry is removed.
pub struct MemoryBackend {
    /// The keys: their holders and waiters in both modes.
    keys: Table,
    fence: AtomicU64,
    waiter_ids: AtomicU64,
    numbers: Mutex<Numbers>,
    pools: Mutex<HashMap<LockKey, BTreeSet<LockKey>>>,
    records: Mutex<RecordStore>,
    /// Where a force release tells its holders (see [`Resets::revoke`]).
    resets: Resets,
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
            keys: Table::default(),
            fence: AtomicU64::new(0),
            waiter_ids: AtomicU64::new(0),
            numbers: Mutex::default(),
            pools: Mutex::default(),
            records: Mutex::new(RecordStore::new(bytes)),
            resets: Resets::new(),
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
    /// counting numeric values (an expired one until the next numeric call sweeps it),
    /// pools, and records and tombstones within their retention.
    pub fn key_count(&self) -> usize {
        let now = Instant::now();
        let keys = self.keys.key_count();
        let numbers = self.numbers.lock().unwrap().len();
        let records = self.records.lock().unwrap().live(now);
        keys + numbers + self.pools.lock().unwrap().len() + records
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

    /// The first holder of `key` (earliest expiry first), if any.
    fn holder_now(&self, key: &LockKey) -> Option<Holder> {
        let holders = self
            .keys
            .with_entry(key, self, |entry, now| Ok(entry.holders(now)));
        holders.ok()?.into_iter().next()
    }

    fn next_fence(&self) -> Fence {
        Fence::new(self.fence.fetch_add(1, Ordering::Relaxed) + 1)
    }

    /// Release `token`'s lease of `key` if it holds one, running `before` (with the current time)
    /// while the key is still held and its shard locked, then hand it to the next waiter.
    fn release_then(
        &self,
        key: &LockKey,
        token: &Token,
        before: impl FnOnce(Instant),
    ) -> Result<(), LockError> {
        self.release_then_at(key, token, None, None, before)
    }

    /// [`release_then`](Self::release_then) as of `now` (`None`: the clock is read), with
    /// the key's `hash` in the table if the caller kept it.
    fn release_then_at(
        &self,
        key: &LockKey,
        token: &Token,
        now: Option<Instant>,
        hash: Option<u64>,
        before: impl FnOnce(Instant),
    ) -> Result<(), LockError> {
        self.keys.with_entry_at(key, self, now, hash, |entry, now| {
            if entry.holds(token) {
                before(now);
            }
            entry.release(token, now, self)
        })
    }

    /// [`Backend::acquire`]: decided at once if it can be, otherwise queued and waited for.
    async fn acquire_queued(&self, req: AcquireRequest) -> Result<Grant, LockError> {
        let started = Instant::now();
        let (rx, id, changed) = {
            let mut shard = self.keys.shard(&req.key);
            // One clock read serves: a lease that starts a moment early only ends early.
            let now = started;
            shard.sweep(now);
            let entry = shard.entry(&req.key);
            if let Some(decided) = entry.decide(&req, now, self) {
                // Refused with nothing held or waiting (a limit of zero): nothing to keep.
                shard.remove_if_empty(&req.key);
                return decided;
            }
            let (tx, rx) = oneshot::channel();
            let id = self.waiter_ids.fetch_add(1, Ordering::Relaxed);
            let queue = &mut entry.queue;
            queue.waiters.push_back(Waiter {
                id,
                token: req.token.clone(),
                ttl: req.ttl,
                mode: req.mode,
                label: req.label.clone(),
                grant: tx,
            });
            let changed = queue.changed.get_or_insert_with(Arc::default).clone();
            (rx, id, changed)
        };
        // Queued: the next FIFO acquire of the key from this engine may go (it queues
        // behind this one).
        req.leave_line();
        let guard = WaitGuard {
            backend: self,
            key: &req.key,
            token: &req.token,
            id,
            rx: Some(rx),
        };
        guard.for_grant(changed, started, req.wait).await
    }

    /// [`SynchronousBackend::acquire_now`].
    fn decide(&self, req: &AcquireRequest, now: Instant) -> Option<Result<Grant, LockError>> {
        let mut shard = self.keys.shard(&req.key);
        shard.sweep(now);
        let entry = shard.entry(&req.key);
        let decided = entry.decide(req, now, self);
        // Undecided means someone holds or waits, so the entry stays; a refusal with
        // nothing held (a limit of zero) leaves nothing.
        shard.remove_if_empty(&req.key);
        // The lease keeps the key's hash for its release.
        let slot = shard.hash();
        decided.map(|d| {
            d.map(|grant| Grant {
                slot: Some(slot),
                ..grant
            })
        })
    }
}

impl Backend for MemoryBackend {
    fn acquire(&self, req: AcquireRequest) -> BoxFuture<'_, Result<Grant, LockError>> {
        Box::pin(self.acquire_queued(req))
    }

    fn release<'a>(
        &'a self,
        key: &'a LockKey,
        token: &'a Token,
        mode: Mode,
    ) -> BoxFuture<'a, Result<(), LockError>> {
        Box::pin(async move { self.release_now(key, token, mode, None, None) })
    }

    fn extend<'a>(
        &'a self,
        key: &'a LockKey,
        token: &'a Token,
        _mode: Mode,
        ttl: Duration,
        how: ExtendMode,
    ) -> BoxFuture<'a, Result<Duration, LockError>> {
        Box::pin(async move {
            self.keys
                .with_entry(key, self, |entry, now| entry.extend(token, ttl, how, now))
        })
    }

    fn renew<'a>(&'a self, leases: &'a [Renewal]) -> BoxFuture<'a, Result<Vec<bool>, LockError>> {
        Box::pin(async move {
            Ok(leases
                .iter()
                .map(|r| {
                    self.keys
                        .with_entry(&r.key, self, |entry, now| {
                            Ok(entry.renew(&r.token, r.ttl, now))
                        })
                        .unwrap_or(false)
                })
                .collect())
        })
    }

    fn holders<'a>(&'a self, key: &'a LockKey) -> BoxFuture<'a, Result<Vec<Holder>, LockError>> {
        Box::pin(async move {
            let holders = self
                .keys
                .with_entry(key, self, |entry, now| Ok(entry.holders(now)));
            Ok(holders.unwrap_or_default())
        })
    }

    fn waiters<'a>(&'a self, key: &'a LockKey) -> BoxFuture<'a, Result<usize, LockError>> {
        Box::pin(async move { Ok(self.keys.shard(key).get(key).map_or(0, |e| e.waiting())) })
    }

    fn has_shared_mode(&self) -> bool {
        true
    }

    /// Only revocations: the table never forgets a grant, but an admin's force release
    /// tells its holders through them.
    fn resets(&self) -> Option<Resets> {
        Some(self.resets.clone())
    }

    fn capabilities(&self) -> Capabilities<'_> {
        Capabilities::none()
            .with_admin(self)
            .with_numeric(self)
            .with_pools(self)
            .with_records(self)
    }
}

// A lease is named by its key and token: the key has one space, and a token holds in
// one mode only, so the mode each call brings is not needed to find it.
impl SynchronousBackend for MemoryBackend {
    fn acquire_now(&self, req: &AcquireRequest, now: Instant) -> Option<Result<Grant, LockError>> {
        self.decide(req, now)
    }

    fn release_now(
        &self,
        key: &LockKey,
        token: &Token,
        _mode: Mode,
        now: Option<Instant>,
        slot: Option<u64>,
    ) -> Result<(), LockError> {
        self.release_then_at(key, token, now, slot, |_| {})
    }
}
