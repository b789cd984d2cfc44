//! The conformance harness on Postgres: a fresh schema per case on the binary's shared
//! cluster (directly, or through its PgBouncer), and what the backend still keeps there.

use std::{
    sync::{
        OnceLock,
        atomic::{AtomicU32, Ordering},
    },
    time::Duration,
};

use tower_lock::engine::postgres::{
    PostgresBackend,
    sqlx::{self, Executor, Row},
};
use tower_lock_test_support::{
    conformance::BackendHarness,
    postgres::{PgBouncer, PostgresServer},
};

/// The binary's PgBouncer, in front of its shared cluster.
pub(crate) fn bouncer() -> &'static PgBouncer {
    static BOUNCER: OnceLock<PgBouncer> = OnceLock::new();
    BOUNCER.get_or_init(|| PgBouncer::start(PostgresServer::shared()))
}

/// A schema name no other case of this process has: keeps cases apart on one cluster.
pub(crate) fn unique_schema(name: &str) -> String {
    static MADE: AtomicU32 = AtomicU32::new(0);
    format!("{name}_{}", MADE.fetch_add(1, Ordering::Relaxed))
}

/// A backend on `url` (its listener on `listen`, the direct address, when `url` is the
/// bouncer's), in a fresh schema, migrated.
pub(crate) async fn backend(url: String, listen: Option<String>, name: &str) -> PostgresBackend {
    let mut builder = PostgresBackend::builder(url)
        .schema(unique_schema(name))
        .pool_size(8);
    if let Some(listen) = listen {
        builder = builder.listen_url(listen);
    }
    builder.migrate().await.expect("migrate the test schema");
    builder.build().await.expect("connect to the test cluster")
}

/// The harness on `url`: the time unit is short but comfortably above a round trip.
pub(crate) async fn harness(
    url: String,
    listen: Option<String>,
) -> BackendHarness<PostgresBackend> {
    let backend = backend(url, listen, "conformance").await;
    BackendHarness::new(backend, Duration::from_millis(200), |b| {
        Box::pin(residue(b))
    })
}

/// The live leases (both modes), numbers and records, pool members and every ticket the backend keeps; rows
/// that stopped holding are fence tombstones, documented and swept, which must not outlive
/// their bound.
pub(crate) async fn residue(backend: &PostgresBackend) -> Vec<String> {
    let schema = backend.schema();
    let prefix = backend.table_prefix();
    let sql = format!(
        "SELECT 'lock ' || key FROM \"{schema}\".\"{prefix}locks\"
           WHERE token IS NOT NULL AND expires_at > clock_timestamp()
         UNION ALL SELECT 'ticket ' || key FROM \"{schema}\".\"{prefix}tickets\"
         UNION ALL SELECT 'shared lease ' || key FROM \"{schema}\".\"{prefix}shared_leases\"
           WHERE expires_at > clock_timestamp()
         UNION ALL SELECT 'number ' || key FROM \"{schema}\".\"{prefix}numbers\"
           WHERE expires_at > clock_timestamp()
         UNION ALL SELECT 'pool ' || pool || ' ' || member FROM \"{schema}\".\"{prefix}pools\"
         UNION ALL SELECT 'record ' || key FROM \"{schema}\".\"{prefix}records\"
           WHERE expires_at > clock_timestamp()
         UNION ALL SELECT 'stale tombstone ' || key FROM \"{schema}\".\"{prefix}locks\"
           WHERE expires_at < clock_timestamp() - interval '15 seconds'
             AND shared_until < clock_timestamp() - interval '15 seconds'"
    );
    // The simple query protocol, as the backend's own calls: it works through PgBouncer.
    let rows = backend
        .pool()
        .fetch_all(sqlx::raw_sql(&sql))
        .await
        .expect("list what the backend keeps");
    rows.iter().map(|row| row.get::<String, _>(0)).collect()
}

/// Until at least `n` of this backend's statements (they name its schema) wait for a lock.
pub(crate) async fn until_lock_waits(backend: &PostgresBackend, n: i64) {
    let sql = format!(
        "SELECT count(*) FROM pg_stat_activity
           WHERE wait_event_type = 'Lock' AND query LIKE '%\"{}\"%'",
        backend.schema()
    );
    loop {
        let row = backend.pool().fetch_one(sqlx::raw_sql(&sql)).await.unwrap();
        if row.get::<i64, _>(0) >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
