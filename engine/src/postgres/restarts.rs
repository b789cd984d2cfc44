//! A database restart is a reset ([`Resets`]): the backend tells the engine, so that every
//! lease granted before it is `lost()` at once.
//!
//! The lock functions commit asynchronously (see `schema`), so a crash of the server may
//! take back the last grants, and a waiter of another node may be granted such a key the
//! moment the server is back. As on Redis, the backend watches its server through a
//! connection that stays open, here the listener's (`LISTEN`), and reports a reset:
//!
//! - when that connection ends, from the listening task the moment it reads the end: a
//!   crashed or killed server's sockets are closed by its kernel, and a server shut down
//!   (fast or immediate) ends its sessions before it stops, so the reset comes before a
//!   restarted server can answer anyone (a restart takes its recovery, at least tens of
//!   milliseconds);
//! - when, on reconnecting, the server's start time (`pg_postmaster_start_time()`) is not
//!   the one seen before: another run, restarted while the connection was down or cut
//!   without the end being seen (a network path that dropped it silently).
//!
//! Told early is safe, told late is not: a listener connection ended alone
//! (`pg_terminate_backend`, a pooler or a firewall in between) is a reset too, and the
//! engine's leases of that node are then reported lost though the server kept them.
//!
//! Limit (unlike Redis, calls do not wait for the watch): a grant made while the listener
//! is down (from its end until it connects again, at most the fallback period and a
//! connect) is watched only by the start-time comparison: if the server restarts again in
//! that window, the reset comes when the listener connects again, not before.

use std::sync::Mutex;

use sqlx::{Executor, postgres::PgListener};

use crate::Resets;

/// The server's start time in µs: the same for as long as the server runs, another after a
/// restart.
const RUN: &str = "SELECT floor(extract(epoch FROM pg_postmaster_start_time()) * 1000000)::bigint";

/// The backend's watch on its server's restarts, fed by the listener.
#[derive(Debug, Default)]
pub(super) struct Restarts {
    resets: Resets,
    /// The start time of the server the listener last connected to.
    seen: Mutex<Option<i64>>,
}

impl Restarts {
    /// Where the engine learns of the resets.
    pub(super) fn resets(&self) -> Resets {
        self.resets.clone()
    }

    /// The listener's connection is up (the first time, or again): a server whose start
    /// time is not the one seen before restarted meanwhile.
    pub(super) async fn connected(&self, connection: &mut PgListener) -> Result<(), sqlx::Error> {
        let row = connection.fetch_one(sqlx::raw_sql(RUN)).await?;
        let run: i64 = sqlx::Row::try_get(&row, 0)?;
        let before = self
            .seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .replace(run);
        if before.is_some_and(|before| before != run) {
            self.resets
                .reset("the postgres server is another run than before (it restarted)");
        }
        Ok(())
    }

    /// The listener's connection ended: the server may have crashed or be restarting.
    pub(super) fn lost(&self) {
        self.resets.reset(
            "the postgres listener's connection ended (the server crashed, restarted, or \
             the connection was cut)",
        );
    }
}
