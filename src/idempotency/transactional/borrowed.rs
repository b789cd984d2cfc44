//! [`BorrowedTransaction`]: the handler's hold on its request's transaction: sqlx's
//! connection for its queries, a fence check, and no commit or rollback.

use std::{
    fmt,
    ops::{Deref, DerefMut},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
};

use sqlx::PgConnection;
use tokio::sync::OwnedMappedMutexGuard;

use super::{FenceError, open::OpenTransaction, tables::Tables};
use crate::LeaseInfo;

type Slot = Option<OpenTransaction>;

/// The request's transaction, borrowed by the handler: it dereferences to sqlx's
/// [`PgConnection`], so `sqlx::query(..).execute(&mut *tx)` runs inside the transaction
/// the layer commits with the idempotency record. It cannot commit or roll back: the
/// layer decides from the answer. Drop it before the handler returns (an extractor's
/// value is dropped with the handler's future); one kept longer makes the request a `500`
/// and its writes are rolled back.
///
/// sqlx knows the connection is in the request's transaction: a `begin()` on it makes a
/// savepoint, whose `commit()` releases it (a part of the handler's work that may fail
/// alone), never the request's transaction. Run a statement that may fail (an insert
/// that may meet a unique violation) in one: a failed statement outside a savepoint
/// aborts the request's transaction, and the request is answered `500`, nothing stored. A
/// `COMMIT` statement sent anyway fails (the records table's commit check refuses a claim
/// without its response) and rolls everything back; it, or a `ROLLBACK`, is answered
/// `500`, nothing stored.
pub struct BorrowedTransaction {
    tx: OwnedMappedMutexGuard<Slot, OpenTransaction>,
    doomed: Arc<AtomicBool>,
    tables: Arc<Tables>,
}

impl fmt::Debug for BorrowedTransaction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BorrowedTransaction")
            .finish_non_exhaustive()
    }
}

impl BorrowedTransaction {
    pub(super) fn new(
        tx: OwnedMappedMutexGuard<Slot, OpenTransaction>,
        doomed: Arc<AtomicBool>,
        tables: Arc<Tables>,
    ) -> Self {
        Self { tx, doomed, tables }
    }

    /// Refuse this request's writes if a newer holder of `lease`'s lock already wrote:
    /// raises the key's high-water mark to the lease's fence in this transaction (one
    /// upsert), or finds it higher. A holder paused past its lease while another took the
    /// lock and wrote gets [`FenceError::Stale`]; the transaction is then rolled back by
    /// the layer, whatever the handler answers. Call it before the writes it guards: the
    /// mark's row stays locked until this transaction ends, so a stale holder's check also
    /// waits for a newer holder in flight, and then refuses.
    pub async fn check_fence(&mut self, lease: &LeaseInfo) -> Result<(), FenceError> {
        // The plain `LockLayer`'s check, on the same table, in the request's transaction.
        let checked = self.tables.fences().check(&mut self.tx, lease).await;
        if checked.is_err() {
            self.doomed.store(true, Ordering::Release);
        }
        checked
    }
}

impl Deref for BorrowedTransaction {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        &self.tx
    }
}

impl DerefMut for BorrowedTransaction {
    fn deref_mut(&mut self) -> &mut PgConnection {
        &mut self.tx
    }
}
