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

use super::{BorrowedTransaction, open::OpenTransaction, tables::Tables};

/// The transaction of a request the transactional layer runs, in the request's
/// extensions. Framework extractors (`tower_lock_axum::Tx`) [`borrow`](Self::borrow) it;
/// nothing can commit it or roll it back but the layer.
#[derive(Clone)]
pub struct LentTransaction {
    slot: Arc<Mutex<Option<OpenTransaction>>>,
    /// Set by a refused fence check: the transaction is rolled back whatever the answer.
    doomed: Arc<AtomicBool>,
    tables: Arc<Tables>,
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
    pub(super) fn new(tx: OpenTransaction, tables: Arc<Tables>) -> Self {
        Self {
            slot: Arc::new(Mutex::new(Some(tx))),
            doomed: Arc::new(AtomicBool::new(false)),
            tables,
        }
    }

    /// The transaction for the handler's queries, waiting while another borrower of the
    /// same request holds it; `None` once the layer took it back.
    pub async fn borrow(&self) -> Option<BorrowedTransaction> {
        let guard = Arc::clone(&self.slot).lock_owned().await;
        OwnedMutexGuard::try_map(guard, Option::as_mut)
            .ok()
            .map(|tx| {
                BorrowedTransaction::new(tx, Arc::clone(&self.doomed), Arc::clone(&self.tables))
            })
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
