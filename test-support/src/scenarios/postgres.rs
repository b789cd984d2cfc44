//! The scenarios' Postgres backend: the test binary's one throwaway cluster
//! ([`PostgresServer::shared`]), reached directly or through the binary's one PgBouncer in
//! transaction pooling mode, with one schema per lock table, and what a table's schema
//! still keeps.
//!
//! A schema per table (not a table prefix in one schema) keeps tables apart as a Redis
//! key prefix does: two tables made with one name never share a row, and a residue check
//! reads its own schema only.

use std::sync::{
    OnceLock,
    atomic::{AtomicU32, Ordering},
};

use tower_lock::LockEngine;
use tower_lock_engine::postgres::{
    PostgresBackend,
    sqlx::{self, Executor, Row},
};

use crate::postgres::{PgBouncer, PostgresServer};

/// Connections per table's pool: the most any scenario keeps busy at once (twenty waiting
/// duplicates share them; each call holds one for one statement).
const POOL_SIZE: u32 = 8;

/// Where a table's engines connect: the calls' URL, and the direct URL of the listener
/// when the calls go through PgBouncer.
#[derive(Clone, Debug)]
pub(super) struct PgPlace {
    url: String,
    listen: Option<String>,
    schema: String,
    /// The first engine's backend, which the residue check queries through.
    backend: PostgresBackend,
}

/// The binary's PgBouncer in transaction pooling mode, in front of its shared cluster.
fn bouncer() -> &'static PgBouncer {
    static BOUNCER: OnceLock<PgBouncer> = OnceLock::new();
    BOUNCER.get_or_init(|| PgBouncer::start(PostgresServer::shared()))
}

/// A schema no other table of this process has: `scenario_<n>` (schema names are at most
/// 24 bytes, so the scenario's name stays in the messages, not in the schema).
fn unique_schema() -> String {
    static MADE: AtomicU32 = AtomicU32::new(0);
    format!("scenario_{}", MADE.fetch_add(1, Ordering::Relaxed))
}

/// A backend on `place`'s schema: a node of its own (its own pool, listener and sweeper).
async fn backend(url: &str, listen: Option<&str>, schema: &str) -> PostgresBackend {
    let mut builder = PostgresBackend::builder(url)
        .schema(schema)
        .pool_size(POOL_SIZE);
    if let Some(listen) = listen {
        builder = builder.listen_url(listen);
    }
    builder.build().await.expect("connect to the test cluster")
}

impl PgPlace {
    /// A fresh schema on the binary's cluster, migrated, and its first engine; through the
    /// PgBouncer when `bouncer` (the listener still connects directly: `LISTEN` needs a
    /// session).
    pub(super) async fn new(bouncer_in_front: bool) -> (LockEngine, Self) {
        let (direct, pooled) = tokio::task::spawn_blocking(move || {
            let direct = PostgresServer::shared().url();
            let pooled = bouncer_in_front.then(|| bouncer().url());
            (direct, pooled)
        })
        .await
        .expect("start the test cluster");
        let (url, listen) = match pooled {
            Some(pooled) => (pooled, Some(direct)),
            None => (direct, None),
        };
        let schema = unique_schema();
        PostgresBackend::builder(&url)
            .schema(&schema)
            .migrate()
            .await
            .expect("migrate the scenario's schema");
        let backend = backend(&url, listen.as_deref(), &schema).await;
        let place = Self {
            url,
            listen,
            schema,
            backend: backend.clone(),
        };
        (LockEngine::new(backend), place)
    }

    /// Another node's engine on the same schema.
    pub(super) async fn node(&self) -> LockEngine {
        LockEngine::new(backend(&self.url, self.listen.as_deref(), &self.schema).await)
    }

    /// What the schema keeps beyond released keys' fence tombstones, then its live
    /// records (each `record <key>`); a record without a finite expiry is in the first
    /// list. A tombstone older than its documented bound (its margin, one sweep period and
    /// some slack) counts as residue.
    pub(super) async fn residue(&self) -> (Vec<String>, Vec<String>) {
        let s = &self.schema;
        let sql = format!(
            "SELECT 'lock ' || key FROM \"{s}\".locks
               WHERE token IS NOT NULL AND expires_at > clock_timestamp()
             UNION ALL SELECT 'ticket ' || key FROM \"{s}\".tickets
             UNION ALL SELECT 'number ' || key FROM \"{s}\".numbers
               WHERE expires_at > clock_timestamp()
             UNION ALL SELECT 'pool ' || pool || ' ' || member FROM \"{s}\".pools
             UNION ALL SELECT 'unexpiring record ' || key FROM \"{s}\".records
               WHERE expires_at = 'infinity'
             UNION ALL SELECT 'stale tombstone ' || key FROM \"{s}\".locks
               WHERE expires_at < clock_timestamp() - interval '15 seconds'
             UNION ALL SELECT 'record ' || key FROM \"{s}\".records
               WHERE expires_at > clock_timestamp() AND expires_at < 'infinity'"
        );
        // The simple query protocol, as the backend's own calls: it works through PgBouncer.
        let rows = self
            .backend
            .pool()
            .fetch_all(sqlx::raw_sql(&sql))
            .await
            .expect("list what the scenario's schema keeps");
        rows.iter()
            .map(|row| row.get::<String, _>(0))
            .partition(|line| !line.starts_with("record "))
    }

    /// The schema's name, for messages.
    pub(super) fn schema(&self) -> &str {
        &self.schema
    }
}
