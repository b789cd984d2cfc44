//! The lock engine: leases on string keys, with no knowledge of HTTP.
//!
//! A [`LockEngine`] is a cheap-to-clone handle over a [`Backend`]: the in-process
//! [`MemoryBackend`] for a single node, or the Redis backend for a fleet. [`LockEngine::lock`]
//! gives a [`Lock`] handle on one key; acquiring it yields a [`Lease`], an RAII guard that
//! is renewed by the engine's watchdog while it lives and released when dropped.
//!
//! ```
//! use std::time::Duration;
//! use tower_lock::LockEngine;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tower_lock::LockError> {
//! let engine = LockEngine::in_memory();
//! let lease = engine
//!     .lock("invoice:42")
//!     .ttl(Duration::from_secs(10))
//!     .wait(Duration::from_secs(2))
//!     .acquire()
//!     .await?;
//! // Pass the fencing token to storage so it can refuse writes from stale holders.
//! println!("holding {} with fence {}", lease.key(), lease.fence());
//! assert!(engine.lock("invoice:42").try_acquire().await.is_err());
//! lease.release().await?;
//! # Ok(())
//! # }
//! ```
//!
//! # Writing a backend
//!
//! A backend implements [`Backend`]: an atomic acquire that may wait (and must clean up
//! after itself when its future is dropped), compare-token release / extend / batched
//! renew, and holder inspection. The conformance suite in `tests/support/conformance.rs`
//! runs unchanged against every backend.

pub(crate) mod background;
mod guard;
mod lease;
mod memory;
mod numeric;
mod pool;
#[cfg(feature = "redis")]
pub mod redis;
mod status;

use std::{fmt, future::Future, pin::Pin, sync::Arc, time::Duration};

use tokio::time::Instant;
use tracing::Instrument;

pub use crate::error::{BackendError, BackendErrorKind, KeyError, LockError};
pub use guard::{GuardError, KeyMutex};
pub use lease::{Lease, LostSignal};
pub use memory::MemoryBackend;
pub use numeric::{Compare, NumericAction, NumericKey, NumericOp};
pub use pool::{LockPool, PoolHealth, PoolOp};
pub use status::{LockAdmin, LockStatus};

use lease::Watchdog;

/// Every member of a pool with its holder, as returned by [`Backend::pool_holders`].
pub type PoolHolders = Vec<(LockKey, Option<Holder>)>;

/// A boxed, sendable future: what [`Backend`] methods return.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The longest key accepted, in bytes.
pub const MAX_KEY_LEN: usize = 512;
/// The longest caller-supplied token accepted, in bytes.
pub const MAX_TOKEN_LEN: usize = 128;
/// The longest lease accepted (365 days): a longer TTL, or an extension past it, is
/// [`LockError::InvalidValue`]. Longer waits need no limit: they are waits without one.
pub const MAX_TTL: Duration = Duration::from_secs(365 * 24 * 60 * 60);

/// A validated lock key: 1 to [`MAX_KEY_LEN`] bytes of UTF-8 with no control characters.
///
/// Keys are data, never syntax: backends must store any valid key without letting its
/// content change where or how it is stored. Cloning is cheap.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LockKey(Arc<str>);

impl LockKey {
    /// Validate `key`.
    pub fn new(key: impl AsRef<str>) -> Result<Self, KeyError> {
        let key = key.as_ref();
        validate(key, MAX_KEY_LEN)?;
        Ok(LockKey(Arc::from(key)))
    }

    /// The key as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

fn validate(s: &str, max: usize) -> Result<(), KeyError> {
    if s.is_empty() {
        return Err(KeyError::Empty);
    }
    if s.len() > max {
        return Err(KeyError::TooLong { len: s.len(), max });
    }
    if s.chars().any(char::is_control) {
        return Err(KeyError::ControlCharacter);
    }
    Ok(())
}

impl fmt::Display for LockKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for LockKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl AsRef<str> for LockKey {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// The owner token of one acquisition. Release, extend and renew compare it atomically,
/// so nobody can release a lease that is not theirs.
///
/// [`Token::random`] makes 128 random bits (the default for every acquisition); a caller
/// may supply its own with [`Lock::token`], for example to make acquisition reentrant
/// per owner.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Token(Arc<str>);

impl Token {
    /// A fresh token of 128 random bits, hex encoded.
    pub fn random() -> Self {
        Token(Arc::from(format!("{:032x}", rand::random::<u128>())))
    }

    /// A caller-supplied token: 1 to [`MAX_TOKEN_LEN`] bytes, no control characters.
    pub fn new(token: impl AsRef<str>) -> Result<Self, KeyError> {
        let token = token.as_ref();
        validate(token, MAX_TOKEN_LEN)?;
        Ok(Token(Arc::from(token)))
    }

    /// The token as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Tokens are capabilities: show only a prefix in logs.
        let shown: String = self.0.chars().take(8).collect();
        write!(f, "Token({shown}…)")
    }
}

/// A fencing token: strictly increases with every acquisition of the same key.
///
/// Pass it to the storage the lock protects and have the storage refuse writes carrying a
/// fence lower than the highest it has seen. That is what keeps storage safe when a lease
/// expires while its holder still runs (a paused process, a network partition): leases
/// alone are not consensus.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct Fence(u64);

impl Fence {
    /// Wrap a raw fence value (for backends).
    pub const fn new(value: u64) -> Self {
        Fence(value)
    }

    /// The raw value.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for Fence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// How [`Lease::extend`]-style operations change a lease's remaining time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExtendMode {
    /// Add the duration to the remaining TTL.
    Add,
    /// Replace the remaining TTL with the duration.
    Replace,
}

/// Options for acquiring a lock. Every field has a default; see each setter.
#[derive(Clone, Debug)]
pub struct LockOptions {
    ttl: Duration,
    wait: Option<Duration>,
    fifo: bool,
    max_waiters: Option<usize>,
    auto_renew: bool,
}

impl Default for LockOptions {
    fn default() -> Self {
        LockOptions {
            ttl: Duration::from_secs(30),
            wait: None,
            fifo: false,
            max_waiters: None,
            auto_renew: true,
        }
    }
}

impl LockOptions {
    /// The defaults: TTL 30 s, wait without limit, not FIFO, no waiter limit, auto-renew on.
    pub fn new() -> Self {
        Self::default()
    }

    /// The lease length. The watchdog renews a live lease at a third of it. Clamped to at
    /// least 1 ms; more than [`MAX_TTL`] makes acquisition fail with
    /// [`LockError::InvalidValue`].
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl.max(Duration::from_millis(1));
        self
    }

    /// How long [`Lock::acquire`] waits for a held key; `Duration::ZERO` makes it
    /// non-blocking. Default: no limit (and so is a wait too long for the clock, such as
    /// `Duration::MAX`).
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = Some(wait);
        self
    }

    /// Wait without a limit (the default).
    pub fn wait_forever(mut self) -> Self {
        self.wait = None;
        self
    }

    /// Grant the key strictly in arrival order (across all nodes on Redis). Default: off.
    pub fn fifo(mut self, fifo: bool) -> Self {
        self.fifo = fifo;
        self
    }

    /// At most this many waiters per key; more get [`LockError::QueueFull`]. Default: none.
    pub fn max_waiters(mut self, max: usize) -> Self {
        self.max_waiters = Some(max);
        self
    }

    /// Renew the lease in the background while its [`Lease`] lives. Default: on.
    pub fn auto_renew(mut self, on: bool) -> Self {
        self.auto_renew = on;
        self
    }

    /// The configured lease length.
    pub fn ttl_value(&self) -> Duration {
        self.ttl
    }

    /// The configured wait limit (`None`: no limit).
    pub fn wait_value(&self) -> Option<Duration> {
        self.wait
    }

    /// Whether FIFO mode is on.
    pub fn fifo_value(&self) -> bool {
        self.fifo
    }

    /// The configured waiter limit (`None`: no limit).
    pub(crate) fn max_waiters_value(&self) -> Option<usize> {
        self.max_waiters
    }
}

/// What a backend is asked to do by an acquire. Built by the engine.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct AcquireRequest {
    /// The key to lock.
    pub key: LockKey,
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
}

/// A successful acquisition, as reported by a backend.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Grant {
    /// The fencing token of this acquisition.
    pub fence: Fence,
    /// No later than the moment the lease's TTL started counting on the backend: the
    /// engine's local validity deadline is `granted_at + ttl`.
    pub granted_at: Instant,
}

impl Grant {
    /// A grant with `fence` whose TTL started no later than `granted_at`.
    pub fn new(fence: Fence, granted_at: Instant) -> Self {
        Grant { fence, granted_at }
    }
}

/// One lease to renew in a batch.
#[derive(Clone, Debug)]
pub struct Renewal {
    /// The key.
    pub key: LockKey,
    /// The lease's token.
    pub token: Token,
    /// The TTL to set.
    pub ttl: Duration,
}

/// Who holds a key, as seen by [`Backend::holder`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Holder {
    /// The holder's token.
    pub token: Token,
    /// Remaining TTL; `None` when the key has no expiry.
    pub ttl: Option<Duration>,
}

impl Holder {
    /// A holder record.
    pub fn new(token: Token, ttl: Option<Duration>) -> Self {
        Holder { token, ttl }
    }
}

/// A place where leases are kept. Implement it to add a backend; every backend must pass
/// the conformance suite.
///
/// Every method is atomic with respect to the others on the same key. Failures of the
/// backend itself are [`LockError::Backend`], returned within the backend's timeout.
pub trait Backend: Send + Sync + 'static {
    /// Acquire `req.key` for `req.token`, waiting as `req.wait` says.
    ///
    /// Acquiring with the token that already holds the key succeeds, refreshes the TTL and
    /// keeps the fence (reentrancy by owner). If the returned future is dropped before it
    /// completes, the backend must leave nothing behind: no waiter entry, and no lease that
    /// landed unseen.
    fn acquire(&self, req: AcquireRequest) -> BoxFuture<'_, Result<Grant, LockError>>;

    /// Release the key if `token` holds it: [`LockError::NotOwned`] if another token
    /// holds it, [`LockError::Expired`] if nobody does. Hands the key to the next waiter.
    fn release<'a>(
        &'a self,
        key: &'a LockKey,
        token: &'a Token,
    ) -> BoxFuture<'a, Result<(), LockError>>;

    /// Change the remaining TTL if `token` holds the key; returns the new remaining TTL.
    fn extend<'a>(
        &'a self,
        key: &'a LockKey,
        token: &'a Token,
        ttl: Duration,
        mode: ExtendMode,
    ) -> BoxFuture<'a, Result<Duration, LockError>>;

    /// Reset the TTL of many leases at once (the watchdog's batch). Returns, per lease,
    /// whether it was still held by its token and is renewed.
    fn renew<'a>(&'a self, leases: &'a [Renewal]) -> BoxFuture<'a, Result<Vec<bool>, LockError>>;

    /// Who holds `key` now, if anyone.
    fn holder<'a>(&'a self, key: &'a LockKey) -> BoxFuture<'a, Result<Option<Holder>, LockError>>;

    /// How many callers wait for `key` now, on every node sharing the backend.
    fn waiters<'a>(&'a self, key: &'a LockKey) -> BoxFuture<'a, Result<usize, LockError>>;

    /// Admin: make `value` the holder of `key` for `ttl` (`None`: no expiry), whoever holds
    /// it now. Waiters keep waiting. The new holding gets a fresh fence.
    fn admin_set<'a>(
        &'a self,
        key: &'a LockKey,
        value: &'a Token,
        ttl: Option<Duration>,
    ) -> BoxFuture<'a, Result<(), LockError>>;

    /// Admin: release `key` whoever holds it, handing it to the next waiter. Returns
    /// whether it was held.
    fn force_release<'a>(&'a self, key: &'a LockKey) -> BoxFuture<'a, Result<bool, LockError>>;

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

pub(crate) struct EngineShared {
    pub(crate) backend: Arc<dyn Backend>,
    pub(crate) watchdog: Watchdog,
    defaults: LockOptions,
}

/// A handle on a lock engine: cheap to clone, shared by every clone.
///
/// Create it once (at startup) and clone it wherever locks are needed; all clones share
/// one backend and one renewal task.
#[derive(Clone)]
pub struct LockEngine {
    shared: Arc<EngineShared>,
}

impl fmt::Debug for LockEngine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockEngine")
            .field("defaults", &self.shared.defaults)
            .finish_non_exhaustive()
    }
}

impl LockEngine {
    /// An engine over the in-process backend: serializes within this process only.
    pub fn in_memory() -> Self {
        Self::new(MemoryBackend::new())
    }

    /// An engine over any backend.
    pub fn new(backend: impl Backend) -> Self {
        Self::from_arc(Arc::new(backend))
    }

    /// An engine over a shared backend.
    pub fn from_arc(backend: Arc<dyn Backend>) -> Self {
        LockEngine {
            shared: Arc::new(EngineShared {
                backend,
                watchdog: Watchdog::new(),
                defaults: LockOptions::default(),
            }),
        }
    }

    /// Set the options every [`Lock`] from this engine starts with.
    pub fn with_defaults(self, defaults: LockOptions) -> Self {
        LockEngine {
            shared: Arc::new(EngineShared {
                backend: self.shared.backend.clone(),
                watchdog: Watchdog::new(),
                defaults,
            }),
        }
    }

    /// A handle on `key`, with the engine's default options. The key is validated when
    /// the lock is used; an invalid key makes every operation return
    /// [`LockError::InvalidKey`].
    pub fn lock(&self, key: impl AsRef<str>) -> Lock {
        Lock {
            engine: self.clone(),
            key: LockKey::new(key),
            options: self.shared.defaults.clone(),
            token: None,
        }
    }

    /// A handle on an already validated key.
    pub fn lock_key(&self, key: LockKey) -> Lock {
        Lock {
            engine: self.clone(),
            key: Ok(key),
            options: self.shared.defaults.clone(),
            token: None,
        }
    }

    /// A [`KeyMutex`] on `key`: run a closure while holding it, or acquire and release by
    /// hand with "already held" / "not held" errors.
    pub fn mutex(&self, key: impl AsRef<str>) -> KeyMutex {
        KeyMutex::new(self.lock(key))
    }

    /// The numeric value under `key`, for compare-and-set.
    pub fn numeric(&self, key: impl AsRef<str>) -> NumericKey {
        NumericKey::new(self.clone(), LockKey::new(key))
    }

    /// The pool named `name`: a set of lock keys with membership and health operations.
    pub fn pool(&self, name: impl AsRef<str>) -> LockPool {
        LockPool::new(self.clone(), LockKey::new(name))
    }

    /// Administrative operations that ignore ownership: mark a key unavailable, force a
    /// release. Meant for operators and tooling, not request paths.
    pub fn admin(&self) -> LockAdmin {
        LockAdmin::new(self.clone())
    }

    /// The backend this engine runs on.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.shared.backend
    }

    /// `true` if both handles share one engine (one backend, one renewal task).
    pub fn same_engine(&self, other: &LockEngine) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }
}

/// A handle on one key of a [`LockEngine`], with its acquisition options.
///
/// Setters consume and return the handle; [`Lock::acquire`] and [`Lock::try_acquire`]
/// yield a [`Lease`], on which release, extend, reacquire and owned live.
#[derive(Clone, Debug)]
pub struct Lock {
    engine: LockEngine,
    key: Result<LockKey, KeyError>,
    options: LockOptions,
    token: Option<Token>,
}

impl Lock {
    /// Replace all options.
    pub fn options(mut self, options: LockOptions) -> Self {
        self.options = options;
        self
    }

    /// See [`LockOptions::ttl`].
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.options = self.options.ttl(ttl);
        self
    }

    /// See [`LockOptions::wait`].
    pub fn wait(mut self, wait: Duration) -> Self {
        self.options = self.options.wait(wait);
        self
    }

    /// See [`LockOptions::fifo`].
    pub fn fifo(mut self, fifo: bool) -> Self {
        self.options = self.options.fifo(fifo);
        self
    }

    /// See [`LockOptions::max_waiters`].
    pub fn max_waiters(mut self, max: usize) -> Self {
        self.options = self.options.max_waiters(max);
        self
    }

    /// See [`LockOptions::auto_renew`].
    pub fn auto_renew(mut self, on: bool) -> Self {
        self.options = self.options.auto_renew(on);
        self
    }

    /// Acquire with this owner token instead of a fresh random one. Acquiring a key that
    /// this token already holds succeeds and refreshes its TTL (reentrancy by owner).
    pub fn token(mut self, token: Token) -> Self {
        self.token = Some(token);
        self
    }

    /// The key, if valid.
    pub fn key(&self) -> Result<&LockKey, LockError> {
        self.key
            .as_ref()
            .map_err(|e| LockError::InvalidKey(e.clone()))
    }

    /// Acquire the key, waiting up to the configured wait limit.
    ///
    /// Errors: [`LockError::TimedOut`] after the wait limit ([`LockError::Busy`] when the
    /// limit is zero), [`LockError::QueueFull`], [`LockError::InvalidKey`],
    /// [`LockError::Backend`]. Dropping the future while it waits leaves nothing behind.
    pub async fn acquire(&self) -> Result<Lease, LockError> {
        self.acquire_with(self.options.wait).await
    }

    /// Acquire the key only if it is free now; otherwise [`LockError::Busy`] with the
    /// holder's remaining TTL.
    pub async fn try_acquire(&self) -> Result<Lease, LockError> {
        self.acquire_with(Some(Duration::ZERO)).await
    }

    async fn acquire_with(&self, wait: Option<Duration>) -> Result<Lease, LockError> {
        let key = self.key()?.clone();
        lease::check_ttl(self.options.ttl)?;
        let token = self.token.clone().unwrap_or_else(Token::random);
        let started = Instant::now();
        // A wait the clock cannot represent is a wait without limit.
        let wait = wait.filter(|w| started.checked_add(*w).is_some());
        let req = AcquireRequest {
            key: key.clone(),
            token: token.clone(),
            ttl: self.options.ttl,
            wait,
            fifo: self.options.fifo,
            max_waiters: self.options.max_waiters,
        };
        let span = tracing::trace_span!("lock.acquire", key = %key, fifo = self.options.fifo);
        let grant = self
            .engine
            .shared
            .backend
            .acquire(req)
            .instrument(span)
            .await?;
        let waited = started.elapsed();
        tracing::trace!(key = %key, fence = grant.fence.get(), ?waited, "lock acquired");
        Ok(Lease::new(
            self.engine.shared.clone(),
            key,
            token,
            grant,
            waited,
            self.options.ttl,
            self.options.auto_renew,
        ))
    }

    /// `true` if anyone holds the key now.
    pub async fn locked(&self) -> Result<bool, LockError> {
        let key = self.key()?;
        Ok(self.engine.shared.backend.holder(key).await?.is_some())
    }

    /// Who holds the key now (token and remaining TTL), if anyone.
    pub async fn holder(&self) -> Result<Option<Holder>, LockError> {
        let key = self.key()?;
        self.engine.shared.backend.holder(key).await
    }

    /// The key's status, judged against this handle's TTL as the expected bound.
    pub async fn status(&self) -> Result<LockStatus, LockError> {
        Ok(LockStatus::from_holder(
            self.holder().await?,
            self.options.ttl,
        ))
    }

    /// How many callers wait for the key now.
    pub async fn waiters(&self) -> Result<usize, LockError> {
        let key = self.key()?;
        self.engine.shared.backend.waiters(key).await
    }
}
