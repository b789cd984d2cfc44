//! [`OpenTransaction`]: a pooled connection inside the transaction the layer begins (with
//! sqlx's own `begin`, its statement the `BEGIN` and the claim, so sqlx knows it is in a
//! transaction: a handler's `begin()` on the lent connection makes a savepoint) and ends with its record write (`UPDATE …; COMMIT`, one
//! round trip) or a rollback. Each of these statements is awaited [`InFlight`]: a future
//! dropped before its reply closes the connection instead of pooling it.

use std::{
    borrow::Cow,
    fmt,
    future::Future,
    ops::{Deref, DerefMut},
    pin::Pin,
};

use sqlx::{
    Executor, PgConnection, PgPool, Postgres, TransactionManager, pool::PoolConnection,
    postgres::PgTransactionManager,
};

use super::in_flight::InFlight;

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
    /// A connection of `pool` in a transaction begun by `statement` (a `BEGIN` and what
    /// follows it in the same simple query, sent as sqlx's `begin` statement, so sqlx
    /// counts the transaction; its rows are not read): one round trip. An error the
    /// server answered (a statement after the `BEGIN` failed) is [`Begun::Refused`], with
    /// the connection in the failed transaction, which sqlx does not count: end it with
    /// [`uncounted`] statements. Any other error (the connection failed, or the future was
    /// dropped before the reply) closes the connection.
    pub(super) async fn begin_with(pool: &PgPool, statement: String) -> Result<Begun, sqlx::Error> {
        let mut conn = InFlight::new(pool.acquire().await?);
        match PgTransactionManager::begin(&mut conn, Some(Cow::Owned(statement))).await {
            Ok(()) => Ok(Begun::Open(Self {
                conn: Some(conn.landed()),
            })),
            Err(error @ sqlx::Error::Database(_)) => Ok(Begun::Refused(error, conn.landed())),
            Err(error) => Err(error),
        }
    }

    /// A connection in a transaction that sqlx does not count yet (begun by an
    /// [`uncounted`] statement): counted now, by sqlx's `begin` with a statement that
    /// does nothing in it (one round trip).
    pub(super) async fn adopt(conn: PoolConnection<Postgres>) -> Result<Self, sqlx::Error> {
        let mut conn = InFlight::new(conn);
        PgTransactionManager::begin(&mut conn, Some(Cow::Borrowed("SELECT 1"))).await?;
        Ok(Self {
            conn: Some(conn.landed()),
        })
    }

    /// End it with `statement`, a simple query of the record write, `COMMIT` and `BEGIN`
    /// (see [`Tables::complete_and_commit`](super::tables::Tables::complete_and_commit)):
    /// the rows the statement affected. sqlx still counts the transaction it began; the
    /// `BEGIN` after the `COMMIT` opens an empty one for sqlx's own rollback to end (queued,
    /// sent with the connection's next message, so no round trip of its own and no
    /// "no transaction in progress" warning). Dropped before the reply, or on an error
    /// that is not the server's answer (the connection failed), the connection is closed
    /// rather than reused: the transaction's fate is the server's. An error the server
    /// answered (the transaction aborted by a statement of the handler's that failed, a
    /// commit refused) skipped the rest of the statement: nothing committed, and the
    /// connection is rolled back and pooled.
    pub(super) async fn commit_with(mut self, statement: &str) -> Result<u64, sqlx::Error> {
        let mut conn = InFlight::new(
            self.conn
                .take()
                .expect("an open transaction has its connection"),
        );
        let done = match (&mut *conn).execute(sqlx::raw_sql(statement)).await {
            Ok(done) => done,
            Err(error @ sqlx::Error::Database(_)) => {
                // The server answered, so the connection's state is known: in the
                // failed transaction (an error before the `COMMIT`) or in none (the
                // `COMMIT` failed). sqlx still counts one, whose rollback ends either.
                tokio::spawn(rollback(conn.landed()));
                return Err(error);
            }
            Err(error) => return Err(error),
        };
        // The server is now in one transaction, the trailing `BEGIN`'s; sqlx's rollback
        // ends it only if sqlx counts exactly one. Any other count (a savepoint the handler
        // leaked, a nested `begin()` or `commit()` of its own that it cancelled): closed.
        if PgTransactionManager::get_transaction_depth(&conn) == 1 {
            PgTransactionManager::start_rollback(&mut conn.landed());
        }
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

/// How [`OpenTransaction::begin_with`] ended, when the server answered.
pub(super) enum Begun {
    /// The transaction is open.
    Open(OpenTransaction),
    /// A statement after the `BEGIN` failed with this error: the connection is in the
    /// failed transaction, not counted by sqlx.
    Refused(sqlx::Error, PoolConnection<Postgres>),
}

/// On a connection whose server-side transaction sqlx does not count (see
/// [`Begun::Refused`]), `statement` (a simple query that ends that transaction first and
/// may begin another): its rows and the connection, in whatever transaction the statement
/// left open (end it with [`uncounted_rollback`], or count it with
/// [`OpenTransaction::adopt`]). An error the server answered rolls back on a task of its
/// own; any other (or the future dropped before the reply) closes the connection.
pub(super) async fn uncounted(
    conn: PoolConnection<Postgres>,
    statement: &str,
) -> Result<(Vec<sqlx::postgres::PgRow>, PoolConnection<Postgres>), sqlx::Error> {
    let mut conn = InFlight::new(conn);
    match (&mut *conn).fetch_all(sqlx::raw_sql(statement)).await {
        Ok(rows) => Ok((rows, conn.landed())),
        Err(error @ sqlx::Error::Database(_)) => {
            uncounted_rollback(conn.landed());
            Err(error)
        }
        Err(error) => Err(error),
    }
}

/// `ROLLBACK` on a connection whose transaction sqlx does not count, on a task of its own;
/// the connection is pooled again if it succeeded, closed otherwise.
pub(super) fn uncounted_rollback(conn: PoolConnection<Postgres>) {
    tokio::spawn(async move {
        let mut conn = InFlight::new(conn);
        if (&mut *conn)
            .execute(sqlx::raw_sql("ROLLBACK"))
            .await
            .is_ok()
        {
            drop(conn.landed());
        }
    });
}

/// Roll back on `conn` (through sqlx's transaction manager, which counts the transaction
/// ended), then let it go back to its pool, or be closed if that failed or the future was
/// dropped before the reply (sqlx would still count the transaction open). A connection on
/// which sqlx counts anything but the layer's one transaction (a savepoint the handler
/// leaked: sqlx would only roll back to it, and pool a connection still in the request's
/// transaction) is closed without a statement: the server aborts all of it.
pub(super) fn rollback(conn: PoolConnection<Postgres>) -> Rollback {
    Box::pin(async move {
        let mut conn = InFlight::new(conn);
        if PgTransactionManager::get_transaction_depth(&conn) == 1
            && PgTransactionManager::rollback(&mut conn).await.is_ok()
        {
            drop(conn.landed());
        }
    })
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
