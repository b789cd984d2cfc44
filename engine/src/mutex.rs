//! [`KeyMutex`]: run a closure while holding a key, releasing on every exit path.

use std::{
    fmt,
    sync::{
        Mutex,
        atomic::{AtomicBool, Ordering},
    },
};

use super::{Lease, Lock, LockError};

/// Why a [`KeyMutex`] operation failed.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum MutexError {
    /// This handle already holds the key (acquire or run while held).
    AlreadyHeld,
    /// This handle does not hold the key (release while not held).
    NotHeld,
    /// The lease ran out (or was taken over) before it was released: the work it guarded
    /// may have overlapped with another holder.
    ExpiredBeforeRelease,
    /// Acquiring failed (busy, timed out, backend failure, ...).
    Lock(LockError),
}

impl fmt::Display for MutexError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::AlreadyHeld => f.write_str("this handle already holds the lock"),
            Self::NotHeld => f.write_str("this handle does not hold the lock"),
            Self::ExpiredBeforeRelease => f.write_str("the lease expired before it was released"),
            Self::Lock(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for MutexError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Lock(e) => Some(e),
            _ => None,
        }
    }
}

impl From<LockError> for MutexError {
    fn from(e: LockError) -> Self {
        Self::Lock(e)
    }
}

/// A mutex on one key of a [`LockEngine`](super::LockEngine): the "decorator" pattern of
/// a SETNX mutex, with ownership tracked by the handle.
///
/// [`KeyMutex::run`] holds the key while a closure's future runs and releases it on every
/// exit: normal return, error, panic (the lease is dropped while unwinding) and
/// cancellation (dropping the future drops the lease).
///
/// ```
/// use tower_lock_engine::LockEngine;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tower_lock_engine::MutexError> {
/// let engine = LockEngine::in_memory();
/// let nightly = engine.mutex("job:nightly-report");
/// let rows = nightly.run(|| async { 42 }).await?;
/// assert_eq!(rows, 42);
/// # Ok(())
/// # }
/// ```
pub struct KeyMutex {
    lock: Lock,
    held: Mutex<Option<Lease>>,
    running: AtomicBool,
}

impl fmt::Debug for KeyMutex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyMutex")
            .field("lock", &self.lock)
            .field("held", &self.is_held())
            .finish()
    }
}

/// Clears the "running" flag however `run` ends.
struct Running<'a>(&'a AtomicBool);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

impl KeyMutex {
    pub(crate) fn new(lock: Lock) -> Self {
        Self {
            lock,
            held: Mutex::new(None),
            running: AtomicBool::new(false),
        }
    }

    /// Use these acquisition options (TTL, wait, FIFO, ...).
    pub fn with_lock(mut self, lock: Lock) -> Self {
        self.lock = lock;
        self
    }

    /// Whether this handle holds the key (by [`KeyMutex::acquire`] or inside `run`).
    pub fn is_held(&self) -> bool {
        self.running.load(Ordering::Acquire) || self.held.lock().unwrap().is_some()
    }

    /// Acquire the key for this handle; [`MutexError::AlreadyHeld`] if it holds it.
    pub async fn acquire(&self) -> Result<(), MutexError> {
        if self.is_held() {
            return Err(MutexError::AlreadyHeld);
        }
        let lease = self.lock.acquire().await?;
        let mut held = self.held.lock().unwrap();
        if held.is_some() || self.running.load(Ordering::Acquire) {
            // Another call on this handle won the race; ours is released on drop.
            return Err(MutexError::AlreadyHeld);
        }
        *held = Some(lease);
        Ok(())
    }

    /// Release the key; [`MutexError::NotHeld`] if this handle does not hold it,
    /// [`MutexError::ExpiredBeforeRelease`] if the lease had already run out.
    pub async fn release(&self) -> Result<(), MutexError> {
        let lease = self
            .held
            .lock()
            .unwrap()
            .take()
            .ok_or(MutexError::NotHeld)?;
        finish(lease).await
    }

    /// Run `f` while holding the key, then release it. The closure's output is returned
    /// only if the lease was still ours at the end; otherwise
    /// [`MutexError::ExpiredBeforeRelease`] tells the caller the work was unprotected.
    pub async fn run<F, Fut, T>(&self, f: F) -> Result<T, MutexError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = T>,
    {
        if self.held.lock().unwrap().is_some() || self.running.swap(true, Ordering::AcqRel) {
            return Err(MutexError::AlreadyHeld);
        }
        let _running = Running(&self.running);
        // Held in a local: a panic or a cancelled future drops it, and drop releases.
        let lease = self.lock.acquire().await?;
        let output = f().await;
        finish(lease).await.map(|()| output)
    }
}

async fn finish(lease: Lease) -> Result<(), MutexError> {
    match lease.release().await {
        Ok(()) => Ok(()),
        Err(LockError::Expired | LockError::NotOwned) => Err(MutexError::ExpiredBeforeRelease),
        Err(e) => Err(MutexError::Lock(e)),
    }
}
