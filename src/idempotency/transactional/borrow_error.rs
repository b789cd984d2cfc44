//! [`BorrowError`]: why [`LentTransaction::borrow`](super::LentTransaction::borrow) lent
//! nothing.

use std::fmt;

/// Why the request's transaction could not be borrowed: either is the server's bug,
/// answered `500` by the framework extractors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BorrowError {
    /// Another borrow of the same request holds it (`Tx` taken twice by one handler, or a
    /// middleware holding one around the handler). Refused at once: waiting for the first
    /// borrower to let go would never end when the same handler holds both. Logged.
    Borrowed,
    /// The layer took it back: the handler has returned.
    Returned,
}

impl fmt::Display for BorrowError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Borrowed => {
                "the request's transaction is already borrowed: take it once per request \
                 (a second Tx extractor, or a middleware holding one around the handler, \
                 would wait for ever)"
            }
            Self::Returned => "the request's transaction was taken back: the handler returned",
        })
    }
}

impl std::error::Error for BorrowError {}
