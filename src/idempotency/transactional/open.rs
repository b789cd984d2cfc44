//! [`OpenTransaction`]: a pooled connection inside the transaction the layer begins (sqlx's
//! own `BEGIN`, so sqlx knows it is in a transaction: a handler's `begin()` on the lent
//! connection makes a savepoint) and ends with its record write (`UPDATE …; COMMIT`, one
//! round trip) or a rollback.

use std::{
    fmt,
    future::Future,
    ops::{Deref, DerefMut},
    pin::Pin,
};

use sqlx::{
    Executor, PgConnection, PgPool, Postgres, TransactionManager, pool::PoolConnection,
    postgres::PgTransactionManager,
};

/// A rollback on its way, which can be spawned.
pub(super) type Rollback = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// A connection in a transaction the layer began through sqlx's transaction manager (so
/// sqlx counts it: a nested `begin()` is a `SAVEPOINT`, never a second `BEGIN` and an
/// early `COMMIT`), ended by the layer's record write with `COMMIT` in the same round trip
/// (sqlx's `Transaction::commit` would cost one more). Dropped while open (a panic, a
/// dropped future), it is rolled back before the connection goes back to the pool.
pub(super) struct OpenTransaction {
    conn: Option<PoolConnection<Postgres>>,
}

impl fmt::Debug for OpenTransaction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenTransaction")
            .field("open", &self.conn.is_some())
            .finish()
    }
}

impl OpenTransaction {
    /// A connection of `pool` in a transaction begun now (one round trip).
    pub(super) async fn begin(pool: &PgPool) -> Result<Self, sqlx::Error> {
        let mut conn = Unsettled(Some(pool.acquire().await?));
        PgTransactionManager::begin(conn.get(), None).await?;
        Ok(Self {
            conn: Some(conn.settled()),
        })
    }

    /// End it with `statement`, a simple query of the record write, `COMMIT` and `BEGIN`
    /// (see [`Tables::complete_and_commit`](super::tables::Tables::complete_and_commit)):
    /// the rows the statement affected. sqlx still counts the transaction it began; the
    /// `BEGIN` after the `COMMIT` opens an empty one for sqlx's own rollback to end (queued,
    /// sent with the connection's next message, so no round trip of its own and no
    /// "no transaction in progress" warning). On an error the connection is closed rather
    /// than reused: the transaction's fate is the server's.
    pub(super) async fn commit_with(mut self, statement: &str) -> Result<u64, sqlx::Error> {
        let mut conn = Unsettled(self.conn.take());
        let done = conn.get().execute(sqlx::raw_sql(statement)).await;
        // An error leaves the connection unsettled: closed, the transaction's fate is the
        // server's.
        let done = done?;
        let mut conn = conn.settled();
        PgTransactionManager::start_rollback(&mut conn);
        Ok(done.rows_affected())
    }

    /// Roll it back, and the connection goes back to the pool (closed if that failed).
    pub(super) fn rollback(mut self) -> Rollback {
        match self.conn.take() {
            Some(conn) => rollback(conn),
            None => Box::pin(async {}),
        }
    }
}

/// Roll back on `conn` (through sqlx's transaction manager, which counts the transaction
/// ended), then let it go back to its pool, or be closed if that failed or did not finish.
pub(super) fn rollback(conn: PoolConnection<Postgres>) -> Rollback {
    Box::pin(async move {
        let mut conn = Unsettled(Some(conn));
        if PgTransactionManager::rollback(conn.get()).await.is_ok() {
            drop(conn.settled());
        }
    })
}

/// A pooled connection with a statement in flight: dropped before [`settled`](Self::settled)
/// (the statement failed, or the future awaiting it was dropped: a client that left, a
/// timeout outside the layer), it is closed rather than returned to the pool. Its server
/// then ends what it was doing (a transaction not committed yet is rolled back), where a
/// connection returned mid-statement would have its statement finished by the pool's ping
/// and go back in a transaction sqlx does not count, for the next user to write in.
struct Unsettled(Option<PoolConnection<Postgres>>);

impl Unsettled {
    fn get(&mut self) -> &mut PoolConnection<Postgres> {
        self.0.as_mut().expect("an unsettled connection is there")
    }

    /// The statement answered: the connection's state is known again.
    fn settled(mut self) -> PoolConnection<Postgres> {
        self.0.take().expect("an unsettled connection is there")
    }
}

impl Drop for Unsettled {
    fn drop(&mut self) {
        if let Some(mut conn) = self.0.take() {
            conn.close_on_drop();
        }
    }
}

impl Drop for OpenTransaction {
    fn drop(&mut self) {
        let Some(mut conn) = self.conn.take() else {
            return;
        };
        // A drop cannot wait: the rollback runs on a task of its own (sqlx returns a
        // connection to its pool on a task too); without a runtime, the connection is
        // closed, which ends the transaction on the server.
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(rollback(conn));
            }
            Err(_) => conn.close_on_drop(),
        }
    }
}

impl Deref for OpenTransaction {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        self.conn
            .as_deref()
            .expect("an open transaction has its connection")
    }
}

impl DerefMut for OpenTransaction {
    fn deref_mut(&mut self) -> &mut PgConnection {
        self.conn
            .as_deref_mut()
            .expect("an open transaction has its connection")
    }
}
