//! [`InFlight`]: a pooled connection while one of the layer's transaction statements
//! (`BEGIN`, the record write with `COMMIT`, `ROLLBACK`) is on its way; if the future
//! awaiting it is dropped (a request dropped before its handler began, a runtime shutting
//! down with a request running on after its client left), the connection is closed, never
//! pooled.

use std::ops::{Deref, DerefMut};

use sqlx::{PgConnection, Postgres, pool::PoolConnection};

/// A connection whose transaction state is unknown until [`landed`](Self::landed) says
/// the statement completed. Dropped before that, it is closed rather than returned to
/// its pool.
///
/// Why closed, and not sqlx's rollback queued behind the statement (`start_rollback`):
/// sqlx returns a dropped connection to its pool after a `ping()` that flushes what was
/// sent and reads its replies, so the whole statement runs, its trailing `BEGIN` too,
/// while sqlx's count of open transactions is whatever it was before the statement (one
/// for a dropped `COMMIT … BEGIN`, one for a dropped `ROLLBACK` that did end the
/// transaction). A queued rollback would have to be right about both for every point the
/// future can stop at, and it rests on sqlx recovering a cancelled query, which its own
/// pool calls a band-aid. A closed connection makes the outcome the server's alone: it
/// runs what it received whole (the `COMMIT`, if it arrived), then ends the session and
/// aborts whatever is not committed; nothing of it reaches the pool's next user, at the
/// cost of one new connection per dropped statement. The record and the rows share that
/// one outcome, so the retry replays, or runs once.
pub(super) struct InFlight {
    conn: Option<PoolConnection<Postgres>>,
}

impl InFlight {
    /// `conn`, about to carry a statement.
    pub(super) fn new(conn: PoolConnection<Postgres>) -> Self {
        Self { conn: Some(conn) }
    }

    /// The statement completed (its replies read): the connection's state is known.
    pub(super) fn landed(mut self) -> PoolConnection<Postgres> {
        self.conn.take().expect("a connection in flight is there")
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.as_mut() {
            // The statement may still run on the server: never back into the pool.
            conn.close_on_drop();
        }
    }
}

impl Deref for InFlight {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        self.conn
            .as_deref()
            .expect("a connection in flight is there")
    }
}

impl DerefMut for InFlight {
    fn deref_mut(&mut self) -> &mut PgConnection {
        self.conn
            .as_deref_mut()
            .expect("a connection in flight is there")
    }
}
