//! [`Permits`]: a handle on one key's permits, N holders at once or one alone.

use std::time::Duration;

use super::{Lease, Lock, LockError, LockKey, LockOptions, PermitHolder, Token, lock::Share};

/// A handle on the permits of one key of a [`LockEngine`](super::LockEngine): up to N
/// shared holders at once (a keyed concurrency limit), or one exclusive holder alone (with
/// shared holders, a read-write lock). Made by
/// [`LockEngine::permits`](super::LockEngine::permits).
///
/// A permit is a [`Lease`] like a lock's: owner token, TTL, renewal by the watchdog,
/// [`Lease::lost`], compare-token release on drop, and a fence that rises with every grant
/// on the key. Waiting is in arrival order: a request is granted on arrival only when
/// nobody waits, and once an exclusive request waits, later shared ones queue behind it,
/// so a steady stream of shared holders never starves an exclusive one. Permits are kept
/// apart from locks: `engine.lock("k")` and `engine.permits("k", n)` do not exclude each
/// other.
///
/// ```
/// use tower_lock_engine::LockEngine;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tower_lock_engine::LockError> {
/// let engine = LockEngine::in_memory();
/// let tenant = engine.permits("tenant:7", 2);
/// let first = tenant.acquire().await?;
/// let second = tenant.acquire().await?;
/// // Two of two permits are held: a third is refused without waiting.
/// assert!(tenant.try_acquire().await.is_err());
/// drop((first, second));
///
/// // Readers share, a writer is alone.
/// let doc = engine.permits("doc:1", u32::MAX);
/// let reader = doc.acquire().await?;
/// assert!(doc.clone().exclusive().try_acquire().await.is_err());
/// reader.release().await?;
/// let writer = doc.exclusive().acquire().await?;
/// assert!(writer.fence().get() > 0);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct Permits {
    lock: Lock,
}

impl Permits {
    pub(super) fn new(mut lock: Lock, permits: u32) -> Self {
        lock.share = Some(Share {
            permits,
            exclusive: false,
        });
        Self { lock }
    }

    fn share(&mut self) -> &mut Share {
        self.lock
            .share
            .as_mut()
            .expect("a permits handle has a share")
    }

    /// Take the key alone: granted when nobody else holds a permit, and while held nobody
    /// else is granted one.
    pub fn exclusive(mut self) -> Self {
        self.share().exclusive = true;
        self
    }

    /// Take one of the N permits, beside other shared holders (the default).
    pub fn shared(mut self) -> Self {
        self.share().exclusive = false;
        self
    }

    /// Whether this handle takes the key alone.
    pub fn is_exclusive(&self) -> bool {
        self.lock.share.is_some_and(|s| s.exclusive)
    }

    /// How many shared holders the key may have at once.
    pub fn limit(&self) -> u32 {
        self.lock.share.map_or(1, |s| s.permits)
    }

    /// Replace all options.
    pub fn options(mut self, options: LockOptions) -> Self {
        self.lock = self.lock.options(options);
        self
    }

    /// See [`LockOptions::ttl`].
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.lock = self.lock.ttl(ttl);
        self
    }

    /// See [`LockOptions::wait`].
    pub fn wait(mut self, wait: Duration) -> Self {
        self.lock = self.lock.wait(wait);
        self
    }

    /// See [`LockOptions::fifo`].
    pub fn fifo(mut self, fifo: bool) -> Self {
        self.lock = self.lock.fifo(fifo);
        self
    }

    /// See [`LockOptions::max_waiters`].
    pub fn max_waiters(mut self, max: usize) -> Self {
        self.lock = self.lock.max_waiters(max);
        self
    }

    /// See [`LockOptions::auto_renew`].
    pub fn auto_renew(mut self, on: bool) -> Self {
        self.lock = self.lock.auto_renew(on);
        self
    }

    /// Acquire with this owner token instead of a fresh random one; acquiring with a token
    /// that already holds a permit of the key refreshes its TTL and keeps its fence. A
    /// shared permit is not upgraded: asking for an exclusive one with its token is
    /// [`LockError::InvalidValue`].
    pub fn token(mut self, token: Token) -> Self {
        self.lock = self.lock.token(token);
        self
    }

    /// The key, if valid.
    pub fn key(&self) -> Result<&LockKey, LockError> {
        self.lock.key()
    }

    /// Acquire a permit, waiting up to the configured wait limit. Errors as
    /// [`Lock::acquire`]'s, and [`LockError::Unsupported`] on a backend without permits,
    /// [`LockError::InvalidValue`] for a limit of zero.
    pub async fn acquire(&self) -> Result<Lease, LockError> {
        self.lock.acquire().await
    }

    /// Acquire a permit only if one is free now and nobody waits; otherwise
    /// [`LockError::Busy`].
    pub async fn try_acquire(&self) -> Result<Lease, LockError> {
        self.lock.try_acquire().await
    }

    /// Who holds permits of the key now.
    pub async fn holders(&self) -> Result<Vec<PermitHolder>, LockError> {
        let key = self.key()?;
        self.lock
            .engine
            .shared
            .permit_backend()?
            .permit_holders(key)
            .await
    }

    /// How many callers wait for a permit of the key now.
    pub async fn waiters(&self) -> Result<usize, LockError> {
        let key = self.key()?;
        self.lock
            .engine
            .shared
            .permit_backend()?
            .permit_waiters(key)
            .await
    }
}
