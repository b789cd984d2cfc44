//! [`LentTransaction`]: the request's transaction as the layer lends it to the handler,
//! through the request extensions; the layer takes it back when the handler returns.

use std::{
    fmt,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
};

use tokio::sync::{Mutex, OwnedMutexGuard};

use super::{
    BorrowError, BorrowedTransaction,
    misuse::{Misuse, MisuseLog},
    open::OpenTransaction,
    tables::Tables,
};

/// The transaction of a request the transactional layer runs, in the request's
/// extensions. Framework extractors (`tower_lock_axum::Tx`) [`borrow`](Self::borrow) it;
/// nothing can commit it or roll it back but the layer.
#[derive(Clone)]
pub struct LentTransaction {
    slot: Arc<Mutex<Option<OpenTransaction>>>,
    /// Set by a refused fence check: the transaction is rolled back whatever the answer.
    doomed: Arc<AtomicBool>,
    tables: Arc<Tables>,
    misuse: Arc<MisuseLog>,
}

impl fmt::Debug for LentTransaction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LentTransaction")
            .field("doomed", &self.doomed.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// What the layer finds when the handler has returned.
pub(super) enum Returned {
    /// Commit or roll back as the answer says.
    Open(OpenTransaction),
    /// A fence check refused this holder: roll back.
    Doomed(OpenTransaction),
    /// The handler (or a task it spawned) still holds it: it is rolled back when that
    /// holder lets go, and the request is answered `500`.
    Held,
}

impl LentTransaction {
    pub(super) fn new(tx: OpenTransaction, tables: Arc<Tables>, misuse: Arc<MisuseLog>) -> Self {
        Self {
            slot: Arc::new(Mutex::new(Some(tx))),
            doomed: Arc::new(AtomicBool::new(false)),
            tables,
            misuse,
        }
    }

    /// The transaction for the handler's queries, at once: [`BorrowError::Borrowed`]
    /// while another borrower of the same request holds it (logged at `error`, throttled),
    /// [`BorrowError::Returned`] once the layer took it back. Never waits: the other
    /// borrower is most often the same handler (`Tx` taken twice) or a middleware around
    /// it, which lets go only when the handler returns, so a wait would never end.
    pub async fn borrow(&self) -> Result<BorrowedTransaction, BorrowError> {
        let Ok(guard) = Arc::clone(&self.slot).try_lock_owned() else {
            self.misuse
                .report(Misuse::SecondBorrow, self.tables.records());
            return Err(BorrowError::Borrowed);
        };
        OwnedMutexGuard::try_map(guard, Option::as_mut)
            .map(|tx| {
                BorrowedTransaction::new(tx, Arc::clone(&self.doomed), Arc::clone(&self.tables))
            })
            .map_err(|_| BorrowError::Returned)
    }

    /// Take the transaction back once the handler returned, without waiting: a handler
    /// that still holds it is a bug answered at once, never a hang.
    pub(super) fn take_back(&self) -> Returned {
        let Ok(mut guard) = self.slot.try_lock() else {
            return Returned::Held;
        };
        match guard.take() {
            Some(tx) if self.doomed.load(Ordering::Acquire) => Returned::Doomed(tx),
            Some(tx) => Returned::Open(tx),
            None => Returned::Held,
        }
    }
}
