//! The backend seam: the core [`Backend`] trait every lease store implements (both modes
//! of the one acquisition model), the optional capability traits, and the values that
//! cross the seam.

use std::{future::Future, pin::Pin, time::Duration};

use tokio::time::Instant;

pub use super::holder::Holder;
use super::{
    ActiveKey, ExtendMode, Fence, HolderLabel, LockError, LockKey, Mode, NumericOp, PoolOp, Record,
    Token,
};

/// Every member of a pool with its holder, as returned by [`PoolBackend::pool_holders`].
pub type PoolHolders = Vec<(LockKey, Option<Holder>)>;

/// A boxed, sendable future: what [`Backend`] methods return.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What a backend is asked to do by an acquire. Built by the engine.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct AcquireRequest {
    /// The key to acquire.
    pub key: LockKey,
    /// How to hold it: the key's lock, or one of its shared leases.
    pub mode: Mode,
    /// The owner token to store.
    pub token: Token,
    /// The lease length.
    pub ttl: Duration,
    /// `Some(ZERO)`: try once and answer [`LockError::Busy`]; `Some(d)`: wait up to `d`,
    /// then answer [`LockError::TimedOut`]; `None`: wait without limit.
    pub wait: Option<Duration>,
    /// Grant in arrival order.
    pub fifo: bool,
    /// Refuse with [`LockError::QueueFull`] when this many already wait.
    pub max_waiters: Option<usize>,
    /// Who is asking, for people reading [`Backend::holders`]: the engine's holder label
    /// (see [`LockEngine::holder_label`](super::LockEngine::holder_label)), with what the
    /// caller added (an HTTP layer's route template). Stored with the lease, kept across
    /// re-entry and renewal; never part of ownership (the token alone is). `None`: none.
    pub label: Option<HolderLabel>,
    /// A FIFO acquire's place among this engine's calls of the key (see
    /// [`AcquireRequest::leave_line`]).
    pub(crate) line: crate::releasing::Line,
}

impl AcquireRequest {
    /// Give up this acquire's place in its key's line: the backend has queued it (its
    /// first attempt was sent or answered), so the next FIFO acquire of the key from this
    /// engine may go. The engine lines up each key's FIFO acquires (and the releases
    /// before them) in the order they were called, because a backend's calls may reach
    /// its store in another order (a pool of connections), and because an acquire that
    /// waits for this engine's release of its key to land would otherwise be passed by
    /// one called after it. A backend that never calls this holds the place until its
    /// acquire returns. Idempotent; nothing for a request not in line.
    pub(crate) fn leave_line(&self) {
        self.line.leave();
    }

    /// A request for `key` in `mode` by `token` for `ttl`, waiting without limit, not
    /// FIFO, with no waiter limit (set the public fields for the rest).
    pub fn new(key: LockKey, mode: Mode, token: Token, ttl: Duration) -> Self {
        Self {
            key,
            mode,
            token,
            ttl,
            wait: None,
            fifo: false,
            max_waiters: None,
            label: None,
            line: Default::default(),
        }
    }
}

/// A successful acquisition, as reported by a backend.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct Grant {
    /// The fencing token of this acquisition.
    pub fence: Fence,
    /// No later than the moment the lease's TTL started counting on the backend: the
    /// engine's local validity deadline is `granted_at + ttl`.
    pub granted_at: Instant,
    /// How long the backend granted the lease for, if shorter than the TTL asked for: a
    /// backend that hands the key to a waiter itself may grant a short claim first, so a
    /// waiter that has gone holds the key only that long. The engine then renews the lease
    /// to its full TTL in the background before the claim runs out. `None`: the full TTL.
    pub valid_for: Option<Duration>,
    /// The in-process backend's hash of the key in its table, which its release then
    /// need not compute again.
    pub(crate) slot: Option<u64>,
}

impl Grant {
    /// A grant with `fence` whose TTL started no later than `granted_at`.
    pub fn new(fence: Fence, granted_at: Instant) -> Self {
        Self {
            fence,
            granted_at,
            valid_for: None,
            slot: None,
        }
    }

    /// This grant, valid for only `valid_for` from `granted_at` until renewed (see
    /// [`Grant::valid_for`](Grant#structfield.valid_for)).
    pub fn valid_for(mut self, valid_for: Duration) -> Self {
        self.valid_for = Some(valid_for);
        self
    }
}

/// One lease to renew in a batch.
#[derive(Clone, Debug)]
pub struct Renewal {
    /// The key.
    pub key: LockKey,
    /// The mode the lease was acquired in.
    pub mode: Mode,
    /// The lease's token.
    pub token: Token,
    /// The TTL to set.
    pub ttl: Duration,
}

/// A place where leases are kept, in both modes of the one acquisition model (see
/// [`Mode`]): a key's lock and its shared leases are one space with one queue, so they
/// exclude each other. Implement it to add a backend; every backend must pass the conformance suite's
/// core cases (in exclusive mode), and in shared mode too if it has shared mode.
///
/// Six methods are required; the optional capabilities are separate traits a backend opts
/// into through [`Backend::capabilities`]. A backend without shared mode leaves
/// [`has_shared_mode`](Self::has_shared_mode) at `false`: the engine then answers
/// [`LockError::Unsupported`] for a shared request without calling it.
///
/// Every method is atomic with respect to the others on the same key. Failures of the
/// backend itself are [`LockError::Backend`], returned within the backend's timeout.
///
/// The promises of the two modes on one key, which the conformance suite's cases check
/// (`cross_mode` and the shared-mode cases):
///
/// - **Exclusion.** A request to hold alone ([`Mode::Exclusive`], or a shared lease with
///   a limit of 1) is granted only when nobody holds the key, in either mode; a shared
///   request only when nobody holds the key alone and fewer than its `limit` hold it.
/// - **Order.** One queue per key for both modes. Nobody waiting is overtaken by a
///   newcomer: a request is granted on arrival only when nobody waits. When holders
///   leave, the queue is granted from its head, as many as fit, stopping at the first that
///   does not: once a request to hold alone waits, later ones queue behind it (no writer
///   starvation).
/// - **Fences** rise strictly per key across both modes.
/// - **Re-entry.** Acquiring with a token that holds the key refreshes its TTL and keeps
///   its fence; a token holding a shared lease with a limit above 1 is not made alone
///   ([`LockError::InvalidValue`] for a request to hold alone, even as the sole holder).
/// - **Status.** [`holders`](Self::holders) lists every holder with its mode;
///   [`waiters`](Self::waiters) counts the one queue.
pub trait Backend: Send + Sync + 'static {
    /// Acquire `req.key` in `req.mode` for `req.token`, waiting as `req.wait` says.
    ///
    /// Acquiring with the token that already holds the key succeeds, refreshes the TTL and
    /// keeps the fence (reentrancy by owner). If the returned future is dropped before it
    /// completes, the backend must leave nothing behind: no waiter entry, and no lease that
    /// landed unseen.
    fn acquire(&self, req: AcquireRequest) -> BoxFuture<'_, Result<Grant, LockError>>;

    /// Release `token`'s lease of `key`, acquired in `mode` (a backend may use it to find
    /// the lease): [`LockError::NotOwned`] if `token` holds none but someone does,
    /// [`LockError::Expired`] if nobody does. Grants the waiters that now fit.
    fn release<'a>(
        &'a self,
        key: &'a LockKey,
        token: &'a Token,
        mode: Mode,
    ) -> BoxFuture<'a, Result<(), LockError>>;

    /// Change the remaining TTL of `token`'s lease of `key`, acquired in `mode`, as `how`
    /// says; returns the new remaining TTL.
    fn extend<'a>(
        &'a self,
        key: &'a LockKey,
        token: &'a Token,
        mode: Mode,
        ttl: Duration,
        how: ExtendMode,
    ) -> BoxFuture<'a, Result<Duration, LockError>>;

    /// Reset the TTL of many leases at once (the watchdog's batch, both modes mixed).
    /// Returns, per lease, whether it was still held by its token and is renewed.
    fn renew<'a>(&'a self, leases: &'a [Renewal]) -> BoxFuture<'a, Result<Vec<bool>, LockError>>;

    /// Who holds `key` now, in either mode: its lock's holder or its shared holders, each
    /// with its mode.
    fn holders<'a>(&'a self, key: &'a LockKey) -> BoxFuture<'a, Result<Vec<Holder>, LockError>>;

    /// How many callers wait for `key` now, in either mode (one queue), on every node
    /// sharing the backend.
    fn waiters<'a>(&'a self, key: &'a LockKey) -> BoxFuture<'a, Result<usize, LockError>>;

    /// Whether this backend has shared mode ([`Mode::Shared`]). Default: `false`, and
    /// the engine answers [`LockError::Unsupported`] for a shared request.
    fn has_shared_mode(&self) -> bool {
        false
    }

    /// The optional capabilities this backend has (admin operations, numeric
    /// compare-and-set, lock pools, records). Default: none; the engine answers
    /// [`LockError::Unsupported`] for what a backend lacks.
    fn capabilities(&self) -> Capabilities<'_> {
        Capabilities::none()
    }

    /// Where the backend reports that it can no longer vouch for the grants it made
    /// before (see [`Resets`](crate::Resets)): the engine then reports their leases lost at
    /// once. Default: `None`, a backend whose grants last as long as their TTLs say.
    fn resets(&self) -> Option<crate::Resets> {
        None
    }
}

/// The optional capabilities of a backend, as [`Backend::capabilities`] reports them.
///
/// ```
/// use tower_lock_engine::{AdminBackend, Capabilities};
///
/// fn report(admin: &dyn AdminBackend) -> Capabilities<'_> {
///     Capabilities::none().with_admin(admin)
/// }
/// ```
#[derive(Clone, Copy, Default)]
pub struct Capabilities<'a> {
    pub(crate) admin: Option<&'a dyn AdminBackend>,
    pub(crate) numeric: Option<&'a dyn NumericBackend>,
    pub(crate) pools: Option<&'a dyn PoolBackend>,
    pub(crate) records: Option<&'a dyn RecordBackend>,
}

/// A backend that can answer an acquisition or a release on the spot, without a future:
/// the in-process one. A layer's request on a free key is then granted in its `call`
/// with no boxed future (the [`Backend`] methods box theirs), and its release on drop
/// needs none either.
///
/// Crate-private, so the backend seam stays the public traits. The engine uses it only
/// when it was handed the in-process backend itself ([`LockEngine::new`]): a backend that
/// wraps one (to count, delay or fail its calls) is always called through [`Backend`].
///
/// [`LockEngine::new`]: super::LockEngine::new
pub(crate) trait SynchronousBackend: Send + Sync {
    /// Acquire `req.key` now if that can be decided now: granted (free, or already held
    /// by `req.token`), or refused without waiting (busy with a zero wait, waiter limit
    /// reached). `None`: the caller must wait, through [`Backend::acquire`]; nothing was
    /// changed. `now` is the caller's clock reading, taken just before: a lease that
    /// starts a moment early only ends early, and the clock is read once per acquisition.
    fn acquire_now(&self, req: &AcquireRequest, now: Instant) -> Option<Result<Grant, LockError>>;

    /// [`Backend::release`], done on the spot, as of `now` when the caller has just read
    /// the clock (`None`: the backend reads it), with the key's [`Grant::slot`] if the grant
    /// had one.
    fn release_now(
        &self,
        key: &LockKey,
        token: &Token,
        mode: Mode,
        now: Option<Instant>,
        slot: Option<u64>,
    ) -> Result<(), LockError>;
}

impl std::fmt::Debug for Capabilities<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Capabilities")
            .field("admin", &self.admin.is_some())
            .field("numeric", &self.numeric.is_some())
            .field("pools", &self.pools.is_some())
            .field("records", &self.records.is_some())
            .finish()
    }
}

impl<'a> Capabilities<'a> {
    /// No optional capability.
    pub fn none() -> Self {
        Capabilities::default()
    }

    /// With admin operations ([`LockAdmin`](super::LockAdmin)).
    pub fn with_admin(mut self, admin: &'a dyn AdminBackend) -> Self {
        self.admin = Some(admin);
        self
    }

    /// With numeric compare-and-set ([`NumericKey`](super::NumericKey)).
    pub fn with_numeric(mut self, numeric: &'a dyn NumericBackend) -> Self {
        self.numeric = Some(numeric);
        self
    }

    /// With lock pools ([`LockPool`](super::LockPool)).
    pub fn with_pools(mut self, pools: &'a dyn PoolBackend) -> Self {
        self.pools = Some(pools);
        self
    }

    /// With records written atomically with a release ([`Lease::complete`](super::Lease::complete)).
    pub fn with_records(mut self, records: &'a dyn RecordBackend) -> Self {
        self.records = Some(records);
        self
    }
}

/// Administrative operations that ignore ownership (see [`LockAdmin`](super::LockAdmin)).
pub trait AdminBackend: Send + Sync {
    /// Admin: make `value` the one holder of `key`, alone (as its lock), for `ttl` (`None`:
    /// no expiry), whoever holds it now in either mode. Waiters keep waiting. The new
    /// holding gets a fresh fence.
    fn admin_set<'a>(
        &'a self,
        key: &'a LockKey,
        value: &'a Token,
        ttl: Option<Duration>,
    ) -> BoxFuture<'a, Result<(), LockError>>;

    /// Admin: release `key` whoever holds it (every holder, in either mode), granting the
    /// waiters that now fit. Returns whether it was held.
    fn force_release<'a>(&'a self, key: &'a LockKey) -> BoxFuture<'a, Result<bool, LockError>>;

    /// Admin: the highest fence the store remembers for `key` (its holder's, or the fence
    /// tombstone a release left): every fence granted for `key` so far is at most this,
    /// and the next grant's is above it. `None` when the store remembers none (never
    /// granted, or swept). The in-process backend's fences are one counter for all keys: it
    /// answers that counter's last value. Default: [`LockError::Unsupported`].
    fn last_fence<'a>(
        &'a self,
        key: &'a LockKey,
    ) -> BoxFuture<'a, Result<Option<Fence>, LockError>> {
        let _ = key;
        Box::pin(std::future::ready(Err(LockError::Unsupported(
            "last_fence",
        ))))
    }

    /// Admin: up to `limit` keys that someone holds or waits for, in key order, each after
    /// `after` (a page's last key) and beginning with `starts_with`, read without blocking
    /// the store (Postgres: a range of the key's index). Default:
    /// [`LockError::Unsupported`] (the Redis backend's keys are listed by `SCAN`, which
    /// `tower-lock-cli list` runs on each node itself).
    fn active_keys<'a>(
        &'a self,
        after: Option<&'a LockKey>,
        starts_with: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<ActiveKey>, LockError>> {
        let _ = (after, starts_with, limit);
        Box::pin(std::future::ready(Err(LockError::Unsupported(
            "active_keys",
        ))))
    }
}

/// Numeric values with atomic compare-and-set (see [`NumericKey`](super::NumericKey)).
pub trait NumericBackend: Send + Sync {
    /// Atomically apply `op` to the numeric value stored under `key` (a namespace apart
    /// from locks). Returns whether the comparison held and the action was applied.
    fn compare_and_set<'a>(
        &'a self,
        key: &'a LockKey,
        op: &'a NumericOp,
    ) -> BoxFuture<'a, Result<bool, LockError>>;

    /// The numeric value stored under `key`, if any.
    fn numeric_get<'a>(&'a self, key: &'a LockKey)
    -> BoxFuture<'a, Result<Option<f64>, LockError>>;
}

/// Named sets of lock keys (see [`LockPool`](super::LockPool)).
pub trait PoolBackend: Send + Sync {
    /// Change the members of pool `pool` atomically; returns the new size.
    fn pool_modify<'a>(
        &'a self,
        pool: &'a LockKey,
        op: &'a PoolOp,
    ) -> BoxFuture<'a, Result<usize, LockError>>;

    /// The members of pool `pool`, sorted.
    fn pool_members<'a>(
        &'a self,
        pool: &'a LockKey,
    ) -> BoxFuture<'a, Result<Vec<LockKey>, LockError>>;

    /// Every member of pool `pool` with its holder, read at one instant (one round trip).
    fn pool_holders<'a>(
        &'a self,
        pool: &'a LockKey,
    ) -> BoxFuture<'a, Result<PoolHolders, LockError>>;
}

/// Records of completed operations, written in the same atomic step as the release of the
/// lock that guarded them (see [`Lease::complete`](super::Lease::complete)): idempotency
/// replay keeps its responses here.
///
/// A record lives under its lock's key, apart from the lock itself, until its retention
/// runs out. A store with a byte budget may drop a record's output earlier (oldest first),
/// but then keeps its tombstone (see [`Record`]) for the rest of the retention: a record
/// that appeared never vanishes before its retention unless it is deleted with
/// [`forget`](Self::forget) (or, documented by the store, the budget cannot hold even the
/// tombstones). Writing one is compare-token checked: a holder whose lease ran out writes
/// nothing.
pub trait RecordBackend: Send + Sync {
    /// The record stored under `key`, if any (and not past its retention).
    fn record<'a>(&'a self, key: &'a LockKey) -> BoxFuture<'a, Result<Option<Record>, LockError>>;

    /// If `token` holds `key`: store `record` under `key` for `retention` (replacing any
    /// earlier one; a tombstone, `kept: false`, is stored as a tombstone) and release the
    /// key, handing it to the next waiter, in one atomic step. Otherwise
    /// [`LockError::NotOwned`] or [`LockError::Expired`], and nothing is written.
    fn complete<'a>(
        &'a self,
        key: &'a LockKey,
        token: &'a Token,
        record: &'a Record,
        retention: Duration,
    ) -> BoxFuture<'a, Result<(), LockError>>;

    /// How long the record (or tombstone) stored under `key` lives on, by the store's
    /// clock: `None` when there is none. [`LockError::Unsupported`] by default (a store
    /// written before this method; every backend of this crate answers it).
    fn record_expiry<'a>(
        &'a self,
        key: &'a LockKey,
    ) -> BoxFuture<'a, Result<Option<Duration>, LockError>> {
        let _ = key;
        Box::pin(std::future::ready(Err(LockError::Unsupported(
            "the record's expiry",
        ))))
    }

    /// Delete the record or tombstone stored under `key`, whoever wrote it; returns
    /// whether there was one (within its retention). The lock on `key` is left as it is:
    /// a holder keeps it, and may still complete and write a new record.
    fn forget<'a>(&'a self, key: &'a LockKey) -> BoxFuture<'a, Result<bool, LockError>>;

    /// The record stored under `req.key` if there is one (then nothing is acquired);
    /// otherwise [`Backend::acquire`] of `req` (always the key's lock: records live beside
    /// it), waiting as it says. A grant means that no
    /// record was stored when the key became `req.token`'s: a grant after a wait looks
    /// again (the holder before may have completed), and gives the key back if it finds
    /// one. One round trip where the backend decides both at once (Redis: one script);
    /// the engine's [`Lock::acquire_or_record`](super::Lock::acquire_or_record) serves it.
    ///
    /// Default: [`LockError::Unsupported`], and the engine reads the record, acquires,
    /// and reads it again.
    fn acquire_or_record(
        &self,
        req: AcquireRequest,
    ) -> BoxFuture<'_, Result<GrantOrRecord, LockError>> {
        let _ = req;
        Box::pin(std::future::ready(Err(LockError::Unsupported(
            "acquire_or_record",
        ))))
    }
}

/// What [`RecordBackend::acquire_or_record`] found: a grant of the key with no record
/// stored, or a stored record (nothing acquired). The engine's handle-level counterpart is
/// [`Acquired`](super::Acquired).
#[derive(Debug)]
#[non_exhaustive]
pub enum GrantOrRecord {
    /// The key was acquired, and no record was stored when it was granted.
    Grant(Grant),
    /// A record is stored under the key; the key was not acquired.
    Record(Record),
}
