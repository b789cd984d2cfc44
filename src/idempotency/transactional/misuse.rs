//! [`Misuse`]: a handler's mistakes with the transaction the layer lends it, each answered
//! `500` with a problem detail that names it (never a `503` with `Retry-After`: a retry
//! meets the same handler) and logged at `error`, throttled per layer and mistake
//! ([`MisuseLog`]): a handler's mistake fails every request that reaches it.

use tower_lock_core::LogThrottle;

/// What the handler did with the request's transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Misuse {
    /// It kept a borrow past its return (an extractor moved into a spawned task).
    Kept,
    /// It ended the transaction itself: a `COMMIT` or `ROLLBACK` statement on the lent
    /// connection. A `COMMIT` fails (the records table's commit check: a claim cannot
    /// commit without its response) and rolls it all back.
    Ended,
    /// A statement failed inside it and the handler answered anyway: Postgres aborted the
    /// transaction, and nothing of it can commit. `SET CONSTRAINTS ALL IMMEDIATE` is one
    /// (the commit check fires at once and refuses).
    FailedStatement,
    /// A second borrow while the first is held (`Tx` taken twice, or a middleware holding
    /// one around the handler): refused at once, where waiting would never end.
    SecondBorrow,
}

impl Misuse {
    /// How many there are (the last is [`SecondBorrow`](Self::SecondBorrow)).
    const COUNT: usize = Self::SecondBorrow as usize + 1;

    /// What happened, for the client's problem detail and the log.
    pub(super) fn detail(self) -> &'static str {
        match self {
            Self::Kept => {
                "the handler kept the request's transaction after it returned; it was rolled \
                 back and no response was stored"
            }
            Self::Ended => {
                "the handler ended the request's transaction (a COMMIT or ROLLBACK statement \
                 on its connection): nothing the handler wrote in it was committed, and no \
                 response was stored; a statement it ran after that was outside the \
                 request's transaction. Use begin() on the transaction for a savepoint"
            }
            Self::FailedStatement => {
                "a statement failed inside the request's transaction and the handler \
                 answered anyway: Postgres aborted the transaction, nothing was committed, \
                 and no response was stored. Run a statement that may fail in a savepoint \
                 (begin() on the transaction), and roll the savepoint back when it fails. \
                 SET CONSTRAINTS ALL IMMEDIATE is refused too (it fires the layer's commit \
                 check before the response is written): set your constraints by name"
            }
            Self::SecondBorrow => {
                "the request's transaction is already borrowed: a handler takes it once (a \
                 second Tx extractor, or a middleware holding one around the handler, \
                 would wait for ever)"
            }
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// The throttled `error!` logs of one layer's handler mistakes, one schedule per
/// [`Misuse`].
#[derive(Debug, Default)]
pub(super) struct MisuseLog {
    throttles: [LogThrottle; Misuse::COUNT],
}

impl MisuseLog {
    /// A request whose handler made `misuse`, under the layer of `records`.
    pub(super) fn report(&self, misuse: Misuse, records: &str) {
        let Some(unlogged) = self.throttles[misuse.index()].due() else {
            return;
        };
        tracing::error!(
            records,
            cause = misuse.detail(),
            unlogged_since_last = unlogged,
            "a handler misused the transaction tower-lock lent it (the server's code, not \
             the client's request): answered 500"
        );
    }
}
