//! [`Mode`]: how an acquisition holds its key, alone (the key's lock) or as one of its
//! shared leases.

/// How an acquisition holds its key. One acquisition model, two spellings (as tokio's
/// `Mutex` is a semaphore of one permit): a lock is the exclusive case.
///
/// A key has two spaces that never exclude each other: its lock ([`Mode::Exclusive`]) and
/// its shared leases ([`Mode::Shared`]). `engine.lock("k")` and
/// `engine.lock("k").shared(n)` may both be held at once. (Kept apart so that the Redis
/// lock keeps its two-round-trip fast path; one queue across both spaces is future work.)
///
/// ```
/// use tower_lock_engine::{LockEngine, Mode};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tower_lock_engine::LockError> {
/// let engine = LockEngine::in_memory();
/// let reader = engine.lock("doc").shared(u32::MAX).acquire().await?;
/// assert_eq!(reader.mode(), Mode::Shared { limit: u32::MAX });
/// // A writer beside the readers: alone among the shared leases.
/// assert!(engine.lock("doc").shared(1).try_acquire().await.is_err());
/// // The key's lock is another space.
/// let lock = engine.lock("doc").acquire().await?;
/// assert_eq!(lock.mode(), Mode::Exclusive);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Mode {
    /// The key's lock: one holder at a time.
    #[default]
    Exclusive,
    /// One of the key's shared leases: granted while fewer than `limit` hold one and
    /// nobody holds one alone. `limit == 1` holds the key alone among its shared leases
    /// (a writer beside readers); `u32::MAX` is no limit; `0` is
    /// [`LockError::InvalidValue`](crate::LockError::InvalidValue). Each request brings
    /// its own limit.
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

    /// Whether a holder in this mode holds its space alone: the lock, or a shared lease
    /// with a limit of 1.
    pub fn is_alone(self) -> bool {
        matches!(self, Self::Exclusive | Self::Shared { limit: 1 })
    }

    /// Whether `self` and `other` name the same space of a key (the lock, or the shared
    /// leases), whatever their limits.
    pub fn same_space(self, other: Self) -> bool {
        self.is_shared() == other.is_shared()
    }
}
