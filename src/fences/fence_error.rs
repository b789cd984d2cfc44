//! [`FenceError`]: a lease's fence refused by the high-water mark of its key, a fence
//! check that failed, or a fences table named outside the rule.

use std::fmt;

/// Why a fence check refused ([`FenceTable::check`](super::FenceTable::check), or the
/// transactional layer's `BorrowedTransaction::check_fence`, which the layer then rolls
/// back whatever the handler answers), or why a [`FenceTable`](super::FenceTable) could
/// not be made or migrated.
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
    /// The check (or the migration) itself failed (the database).
    Database(sqlx::Error),
    /// [`FenceTable::new`](super::FenceTable::new): the schema or prefix is not a plain
    /// lower-case name (ASCII letters, digits, `_`, not starting with a digit, at most 40
    /// bytes).
    Name(String),
}

impl fmt::Display for FenceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Stale { key, fence } => write!(
                f,
                "stale fence {fence} for {key:?}: a newer holder of the lock already wrote"
            ),
            Self::Database(e) => write!(f, "the fence check failed: {e}"),
            Self::Name(names) => write!(
                f,
                "the fences table's schema and prefix must be lower-case ASCII letters, \
                 digits and `_`, not starting with a digit, at most 40 bytes: {names}"
            ),
        }
    }
}

impl std::error::Error for FenceError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Stale { .. } | Self::Name(_) => None,
            Self::Database(e) => Some(e),
        }
    }
}
