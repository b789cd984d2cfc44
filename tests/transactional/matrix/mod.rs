//! The configuration matrix, the transactional layer's half (issue 49): the layer under
//! the server settings production deployments run, each a database (or a role) of the
//! binary's shared cluster with its own defaults, so one cluster serves every setting.
//! Each module runs the cases its setting can affect, and says which and why; the others
//! are the setting-blind cases the default cluster already runs.
//!
//! Rows of the matrix tested elsewhere in this binary:
//! - `default_transaction_isolation` `serializable` and `repeatable read`: `isolation`
//!   (duplicates waiting on a first request's claim, replayed when it commits);
//! - a schema and a prefix that are reserved words, capitals refused by name: `names`;
//! - PgBouncer in transaction mode with two server connections that other clients keep
//!   busy, every statement of the layer and the sweep: `busy_pooler`;
//! - Postgres restarted mid-request, directly and through PgBouncer: `crash`.
//!
//! Rows here: `statement_timeout` shorter than the layer's `wait`
//! ([`statement_timeout`]); `idle_session_timeout` and
//! `idle_in_transaction_session_timeout` of a second ([`idle_timeouts`]); least privilege
//! ([`least_privilege`]); a database restart and a pooler restart under load
//! ([`restarts`]); and each sentence of `docs/transactional.md`'s "Behind PgBouncer"
//! ([`pgbouncer`]).

mod idle_timeouts;
mod least_privilege;
mod pgbouncer;
mod restarts;
mod statement_timeout;

use std::{collections::HashMap, sync::Mutex};

use tower_lock_test_support::postgres::PostgresServer;

/// The URL of database `name` on the shared cluster, made on first use with `settings` as
/// its defaults (`ALTER DATABASE … SET`).
pub(crate) async fn database(
    name: &'static str,
    settings: &'static [(&'static str, &'static str)],
) -> String {
    static MADE: Mutex<Option<HashMap<&'static str, String>>> = Mutex::new(None);
    tokio::task::spawn_blocking(move || {
        let mut made = MADE.lock().unwrap();
        made.get_or_insert_with(HashMap::new)
            .entry(name)
            .or_insert_with(|| PostgresServer::shared().database(name, settings))
            .clone()
    })
    .await
    .unwrap()
}
