//! [`Mode`]: how an acquisition holds its key, alone (the key's lock) or as one of its
//! shared leases.

/// How an acquisition holds its key. One acquisition model, two spellings (as tokio's
/// `Mutex` is a semaphore of one permit): a lock is the exclusive case.
///
/// A key has one space for both modes: its holders are either one holder alone (the key's
/// lock, [`Mode::Exclusive`], or a shared lease with a limit of 1) or shared holders up
/// to their limits, never both. So `engine.lock("k")` waits for every shared lease of `k`
/// and keeps them out while it holds, and a shared lease waits for the lock. Waiters of
/// both modes queue in one arrival order and are granted from its head, as many as fit:
/// a lock that waits is not overtaken by shared requests that come after it, however
/// many would fit beside the current holders. Fences rise across both modes.
///
/// ```
/// use tower_lock_engine::{LockEngine, Mode};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tower_lock_engine::LockError> {
/// let engine = LockEngine::in_memory();
/// let reader = engine.lock("doc").shared(u32::MAX).acquire().await?;
/// assert_eq!(reader.mode(), Mode::Shared { limit: u32::MAX });
/// // The key's lock waits for its shared leases ...
/// assert!(engine.lock("doc").try_acquire().await.is_err());
/// reader.release().await?;
/// let lock = engine.lock("doc").acquire().await?;
/// assert_eq!(lock.mode(), Mode::Exclusive);
/// // ... and keeps them out while it holds, whatever their limit.
/// assert!(engine.lock("doc").shared(u32::MAX).try_acquire().await.is_err());
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Mode {
    /// The key's lock: one holder at a time.
    #[default]
    Exclusive,
    /// One of the key's shared leases: granted while fewer than `limit` hold the key and
    /// nobody holds it alone. `limit == 1` holds the key alone, as its lock does (at most
    /// one shared holder, beside no lock: a writer beside readers); `u32::MAX` is no
    /// limit; `0` is [`LockError::InvalidValue`](crate::LockError::InvalidValue). Each
    /// request brings its own limit.
    Shared {
        /// How many shared holders the key may have at once, this one included.
        limit: u32,
    },
}

impl Mode {
    /// Whether this is one of the key's shared leases (not its lock).
    pub fn is_shared(self) -> bool {
        matches!(self, Self::Shared { .. })
    }

    /// Whether a holder in this mode holds the key alone, beside no other holder of
    /// either mode: the lock, or a shared lease with a limit of 1.
    pub fn is_alone(self) -> bool {
        matches!(self, Self::Exclusive | Self::Shared { limit: 1 })
    }
}
