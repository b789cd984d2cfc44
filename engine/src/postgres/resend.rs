//! Sending a call's statement, and the one rule for sending it again, stated by what the
//! server could have done with the first.
//!
//! A call fails in one of three ways, and what the server may have done decides:
//!
//! - **It never ran.** Nothing of the reply arrived and the first thing the server said was
//!   that the session had ended (`FATAL` with SQLSTATE class `57P`, operator intervention:
//!   `57P01` terminated by `pg_terminate_backend` or a shutdown, `57P02` crash, `57P03`
//!   not accepting connections, `57P05` `idle_session_timeout`), or the message could not
//!   be written at all (`BrokenPipe`: the peer had closed). Not class `08` (a connection
//!   exception): PgBouncer sends `08P01` when it drops a client, also after it forwarded
//!   the message to a server (`query_timeout`, "server conn crashed?"), where the server
//!   may still run and commit it: that is "may have run" below. The server answers a message in
//!   order, beginning with the leading `SET TRANSACTION` (see `sql`): a session ended
//!   before that reply is one that ran nothing of the message. This is what a pooled
//!   connection that died while idle answers, and sqlx's pool does hand those out (it pings
//!   none before a call, which would double the round trips). **Every call** is then sent
//!   again, once, on a fresh connection, within its deadline: a release frees the key at
//!   once instead of leaving it held for its lease's TTL.
//! - **It may have run.** The connection broke after the message went out (an I/O error
//!   while reading, a session ended after part of the reply, or a pooler's `FATAL` of
//!   class `08` at any point): the server may have committed it. Only a call whose
//!   repetition reports what the first did is sent again: an acquire attempt (its repeat
//!   is a re-entry), a release (the key's row keeps the id of its last release, so a
//!   release that ran answers "released" again), a waiter's leave, a renewal and the
//!   reads. An extension, a completion, a compare-and-set, an admin or pool change is
//!   not: its repeat would report what the first did as a failure (`Expired`), or do it
//!   twice. A PgBouncer that shuts down, a network cut and a crash end connections
//!   without a word, so this is what a release meets after a pooler restart.
//! - **It ran and failed** (any other database error, a timeout): not sent again.

use futures_util::TryStreamExt;
use sqlx::{
    Either, Executor, PgPool,
    postgres::{PgPoolOptions, PgRow},
};

/// A call that failed, and whether any of the reply to its message had arrived.
pub(super) struct Failed {
    pub(super) error: sqlx::Error,
    replied: bool,
}

/// Send `sql` (one simple-protocol message) on a connection of `pool`: its rows.
pub(super) async fn send(pool: &PgPool, sql: &str) -> Result<Vec<PgRow>, Failed> {
    let mut replies = pool.fetch_many(sqlx::raw_sql(sql));
    let mut rows = Vec::new();
    let mut replied = false;
    loop {
        match replies.try_next().await {
            Ok(Some(Either::Right(row))) => rows.push(row),
            Ok(Some(Either::Left(_done))) => {}
            Ok(None) => return Ok(rows),
            Err(error) => return Err(Failed { error, replied }),
        }
        replied = true;
    }
}

/// Send `sql` on a connection of its own (the pool's idle ones may all have died at once:
/// a restart ends them together), closed after.
pub(super) async fn send_fresh(pool: &PgPool, sql: &str) -> Result<Vec<PgRow>, sqlx::Error> {
    let fresh = PgPoolOptions::new()
        .max_connections(1)
        .connect_with((*pool.connect_options()).clone())
        .await?;
    let again = send(&fresh, sql).await;
    fresh.close().await;
    again.map_err(|failed| failed.error)
}

/// Whether the call `what` reports what the first did when it runs twice (see the module
/// docs).
fn repeat_changes_nothing(what: &str) -> bool {
    matches!(
        what,
        "acquire"
            | "release"
            | "leave"
            | "renew"
            | "holder"
            | "waiters"
            | "numeric_get"
            | "pool_members"
            | "pool_holders"
            | "record"
            | "active_keys"
    )
}

/// Whether the failed call `what` is sent again, once, on a fresh connection.
pub(super) fn send_again(what: &str, failed: &Failed) -> bool {
    never_ran(failed) || (repeat_changes_nothing(what) && connection_lost(&failed.error))
}

/// The statement never ran: nothing of the reply came before the end of the session, or
/// the message was never written.
fn never_ran(failed: &Failed) -> bool {
    if failed.replied {
        return false;
    }
    match &failed.error {
        sqlx::Error::Io(e) => e.kind() == std::io::ErrorKind::BrokenPipe,
        sqlx::Error::Database(db) => {
            let fatal = db
                .try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
                .is_some_and(|pg| {
                    matches!(
                        pg.severity(),
                        sqlx::postgres::PgSeverity::Fatal | sqlx::postgres::PgSeverity::Panic
                    )
                });
            fatal && db.code().is_some_and(|c| ended_by_the_server(&c))
        }
        _ => false,
    }
}

/// The connection is gone, whenever it went (before or after the statement ran).
fn connection_lost(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Io(_) => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|c| session_ended(&c)),
        _ => false,
    }
}

/// SQLSTATEs of a session the server itself ended before it ran anything of the message:
/// class `57P` (operator intervention). Not class `08`: PgBouncer sends `08P01` also after
/// it forwarded the message (`query_timeout`, "server conn crashed?"), when the server may
/// still run and commit it.
fn ended_by_the_server(code: &str) -> bool {
    code.starts_with("57P")
}

/// SQLSTATEs of a session the server (or the pooler) ended: class `57P` (operator
/// intervention: shutdown, crash, starting up, idle-session timeout) and class `08`
/// (connection exception).
fn session_ended(code: &str) -> bool {
    code.starts_with("57P") || code.starts_with("08")
}
