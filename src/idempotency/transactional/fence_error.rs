//! [`FenceError`]: a lease's fence refused by the high-water mark of its key, or a fence
//! check that failed.

use std::fmt;

/// Why [`BorrowedTransaction::check_fence`](super::BorrowedTransaction::check_fence)
/// refused. Either way the transaction is doomed: the layer rolls it back, whatever the
/// handler answers.
#[derive(Debug)]
#[non_exhaustive]
pub enum FenceError {
    /// A newer holder of the lock already wrote under this key: this holder's lease
    /// expired (a pause, a partition) and its writes must not land.
    Stale {
        /// The lock key.
        key: String,
        /// This holder's fence.
        fence: u64,
    },
    /// The check itself failed (the database).
    Database(sqlx::Error),
}

impl fmt::Display for FenceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Stale { key, fence } => write!(
                f,
                "stale fence {fence} for {key:?}: a newer holder of the lock already wrote"
            ),
            Self::Database(e) => write!(f, "the fence check failed: {e}"),
        }
    }
}

impl std::error::Error for FenceError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Stale { .. } => None,
            Self::Database(e) => Some(e),
        }
    }
}
