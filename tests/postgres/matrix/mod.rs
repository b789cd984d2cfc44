//! The configuration matrix: the backend under the server settings production deployments
//! run, each a database (or a role) of the binary's shared cluster with its own defaults,
//! so one cluster serves every setting. Each module runs the conformance cases the setting
//! can affect (its docs say which and why); the others are the setting-blind cases the
//! default cluster already runs. A PgBouncer in transaction mode whose two server
//! connections are kept busy is `busy_pooler`; a pooled connection the server ended while
//! idle is `dead_idle`; a database crash and restart under a holder and a waiter is
//! `restart`.

mod idle_timeouts;
mod isolation_levels;
mod least_privilege;
mod names;
mod restarts;
mod statement_timeout;

use std::{collections::HashMap, sync::Mutex, time::Duration};

use tower_lock::engine::postgres::PostgresBackend;
use tower_lock_test_support::{conformance::BackendHarness, postgres::PostgresServer};

use crate::harness::{backend, residue};

/// The URL of database `name` on the shared cluster, made on first use with `settings` as
/// its defaults.
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

/// The conformance harness on database `name` (made with `settings`), in a fresh schema.
pub(crate) async fn harness_on(
    name: &'static str,
    settings: &'static [(&'static str, &'static str)],
) -> BackendHarness<PostgresBackend> {
    let url = database(name, settings).await;
    let backend = backend(url, None, name).await;
    BackendHarness::new(backend, Duration::from_millis(200), |b| {
        Box::pin(residue(b))
    })
}
