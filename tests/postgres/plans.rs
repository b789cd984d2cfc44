//! A lock operation reads its key by the primary key however large the lock table: the
//! functions' arguments carry the default collation. (`convert_from`, which writes every
//! text argument, takes the collation of its `name` argument, `C`; a plpgsql function's
//! parameters take the call's, and `key = k` in `C` is a comparison no index of the
//! default collation serves: every acquire and release read the whole table, 20 ms a cycle
//! at 200,000 rows.)

use std::time::Duration;

use tower_lock::engine::{
    LockEngine,
    postgres::{
        PostgresBackend,
        sqlx::{self, Row},
    },
};
use tower_lock_test_support::postgres::PostgresServer;

/// The sequential and the index scans of the schema's tables so far, as the statistics
/// have them, after the engine's session (the pool's only connection) flushed its own.
async fn scans(pool: &sqlx::PgPool) -> (i64, i64) {
    sqlx::raw_sql("SELECT pg_stat_force_next_flush()")
        .execute(pool)
        .await
        .unwrap();
    sqlx::query(
        "SELECT coalesce(sum(seq_scan), 0)::bigint, coalesce(sum(idx_scan), 0)::bigint \
         FROM pg_stat_user_tables WHERE schemaname = 'plans'",
    )
    .fetch_one(pool)
    .await
    .map(|row| (row.get(0), row.get(1)))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_lock_operation_finds_its_key_by_index_on_a_large_table() {
    let url = tokio::task::spawn_blocking(|| PostgresServer::shared().url())
        .await
        .unwrap();
    let builder = PostgresBackend::builder(&url).schema("plans").pool_size(1);
    builder.migrate().await.unwrap();
    let backend = builder.build().await.unwrap();
    let pool = backend.pool().clone();
    let engine = LockEngine::new(backend);
    for table in ["locks", "shared_leases", "tickets"] {
        let rows = format!(
            "INSERT INTO plans.{table} (key, token, {columns}) \
             SELECT 'fill' || g, 'holder', {values} FROM generate_series(1, 20000) g; \
             ANALYZE plans.{table}",
            columns = match table {
                "locks" => "fence, expires_at",
                "shared_leases" => "fence, alone, expires_at",
                _ => "id, deadline, ttl_ms, claim_ms",
            },
            values = match table {
                "locks" => "g, clock_timestamp() + interval '1 hour'",
                "shared_leases" => "g, false, clock_timestamp() + interval '1 hour'",
                _ => "'n:' || g, clock_timestamp() + interval '1 hour', 1000, 1000",
            },
        );
        sqlx::raw_sql(&rows).execute(&pool).await.unwrap();
    }
    let (sequential, indexed) = scans(&pool).await;
    for i in 0..10 {
        let lock = engine.lock(format!("k{}", i % 3));
        let lease = lock.acquire().await.unwrap();
        lease.extend(Duration::from_secs(1)).await.unwrap();
        assert_eq!(lock.holders().await.unwrap().len(), 1);
        lease.release().await.unwrap();
        let lease = lock.try_acquire().await.unwrap();
        lease.release().await.unwrap();
        let shared = engine.lock(format!("s{}", i % 3)).shared(2);
        let lease = shared.acquire().await.unwrap();
        lease.extend(Duration::from_secs(1)).await.unwrap();
        lease.release().await.unwrap();
    }
    let (now_sequential, now_indexed) = scans(&pool).await;
    assert!(
        now_indexed > indexed,
        "the session's statistics never arrived"
    );
    assert_eq!(
        now_sequential - sequential,
        0,
        "sequential scans of the lock tables in 10 rounds of lock operations"
    );
}

/// The SQL helpers the lock functions call at every grant are inlined into the calling
/// statements: one that is not runs through the SQL-function executor, which parsed its
/// body again at every call from plpgsql (`us`, whose `extract(epoch FROM timestamptz)` is
/// only stable though the function is declared immutable: 6% of an uncontended cycle's
/// server time).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_clock_helpers_are_inlined_where_they_are_called() {
    let url = tokio::task::spawn_blocking(|| PostgresServer::shared().url())
        .await
        .unwrap();
    let builder = PostgresBackend::builder(&url).schema("inlined");
    builder.migrate().await.unwrap();
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    for call in [
        "inlined.us(now())",
        "inlined.ms(now() + interval '1 s', now())",
    ] {
        let plan: Vec<String> = sqlx::query_scalar(&format!("EXPLAIN VERBOSE SELECT {call}"))
            .fetch_all(&pool)
            .await
            .unwrap();
        let plan = plan.join("\n");
        assert!(!plan.contains("inlined."), "{call} is not inlined:\n{plan}");
    }
    let same: Vec<bool> = sqlx::query_scalar(
        "SELECT inlined.us(t) = floor(extract(epoch FROM t) * 1000000)::bigint \
         FROM (VALUES (timestamptz '2026-11-29 12:00:00.123456+05'), (now())) v(t)",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(same, [true, true], "us() reads a time as before");
}
