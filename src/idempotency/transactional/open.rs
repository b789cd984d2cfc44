//! [`OpenTransaction`]: a pooled connection inside the transaction the layer began with
//! its claim, in one round trip (`BEGIN; SELECT …claim…`, a simple query), and ends with
//! its record write (`UPDATE …; COMMIT`) or a rollback.

use std::{
    fmt,
    future::Future,
    ops::{Deref, DerefMut},
    pin::Pin,
};

use sqlx::{Executor, PgConnection, Postgres, pool::PoolConnection};

/// A rollback on its way, which can be spawned.
pub(super) type Rollback = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// A connection in a transaction begun by a simple query: sqlx's `Transaction` would
/// send its own `BEGIN` and `COMMIT`, a round trip each, where the layer sends them with
/// its claim and its record write. Dropped while open (a panic, a dropped future), it is
/// rolled back before the connection goes back to the pool.
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
    /// `conn`, on which a statement beginning a transaction succeeded.
    pub(super) fn begun(conn: PoolConnection<Postgres>) -> Self {
        Self { conn: Some(conn) }
    }

    /// End it with `statement`, a simple query whose last command is `COMMIT` (the record
    /// write before it): the rows the statement affected. On an error the connection is
    /// closed rather than reused: the transaction's fate is the server's.
    pub(super) async fn commit_with(mut self, statement: &str) -> Result<u64, sqlx::Error> {
        let mut conn = self
            .conn
            .take()
            .expect("an open transaction has its connection");
        match conn.execute(sqlx::raw_sql(statement)).await {
            Ok(done) => Ok(done.rows_affected()),
            Err(error) => {
                conn.close_on_drop();
                Err(error)
            }
        }
    }

    /// Roll it back, and the connection goes back to the pool (closed if that failed).
    pub(super) fn rollback(mut self) -> Rollback {
        match self.conn.take() {
            Some(conn) => rollback(conn),
            None => Box::pin(async {}),
        }
    }
}

/// Roll back on `conn` (a simple query), then let it go back to its pool, or be closed if
/// that failed. (`Executor::execute` on the connection itself: its boxed future can be
/// spawned, where a generic executor's cannot.)
pub(super) fn rollback(mut conn: PoolConnection<Postgres>) -> Rollback {
    Box::pin(async move {
        if conn.execute("ROLLBACK").await.is_err() {
            conn.close_on_drop();
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
