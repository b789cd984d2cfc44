//! The sweeper at scale: what expired found by an index, in batches, one node of the fleet
//! sweeping at a time.

use tower_lock::engine::postgres::{
    PostgresBackend,
    sqlx::{self, Connection, Executor, PgPool, Row, postgres::PgConnection},
};
use tower_lock_test_support::postgres::PostgresServer;

use crate::harness::{backend, unique_schema};

async fn url() -> String {
    tokio::task::spawn_blocking(|| PostgresServer::shared().url())
        .await
        .unwrap()
}

/// `sql`'s one number.
async fn number(pool: &PgPool, sql: &str) -> i64 {
    let row = pool.fetch_one(sqlx::raw_sql(sql)).await.unwrap();
    row.get::<i64, _>(0)
}

/// `n` key rows released an hour ago (tombstones past any margin) named `<name><i>`, and
/// `live` leases held for an hour.
async fn fill(pool: &PgPool, s: &str, name: &str, n: i64, live: i64) {
    pool.execute(sqlx::raw_sql(&format!(
        "INSERT INTO \"{s}\".locks (key, token, fence, expires_at)
               SELECT '{name}' || g, NULL, g, clock_timestamp() - interval '1 hour'
                 FROM generate_series(1, {n}) g;
             INSERT INTO \"{s}\".locks (key, token, fence, expires_at)
               SELECT 'live{name}' || g, 'token', g, clock_timestamp() + interval '1 hour'
                 FROM generate_series(1, {live}) g;
             INSERT INTO \"{s}\".records
                 (key, fingerprint, meta, body, completed_at_ms, kept, expires_at)
               SELECT '{name}' || g, '\\x00', '\\x00', '\\x00', 0, true,
                      clock_timestamp() - interval '1 hour'
                 FROM generate_series(1, {n}) g;
             ANALYZE \"{s}\".locks; ANALYZE \"{s}\".records;"
    )))
    .await
    .unwrap();
}

/// Two nodes sweep at once: the first holds the fleet's sweep (its transaction still open
/// after one batch of 1,000); the second's background-style sweep (`try_only`) finds it and
/// does nothing; once the first commits, a sweep does the rest. Several nodes sweeping by
/// hand at the same moment wait for each other, none fails, and nothing expired is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_nodes_sweeping_at_once_one_does_the_work() {
    let url = url().await;
    // No node of this schema is built before the four below: a built node's own sweeper
    // (every 5 s) could take the fleet's sweep the moment this test's first node does.
    let s = unique_schema("sweep_once");
    PostgresBackend::builder(url.clone())
        .schema(&s)
        .migrate()
        .await
        .unwrap();
    let pool = PgPool::connect(&url).await.unwrap();
    fill(&pool, &s, "k", 3000, 0).await;
    let sweep = |try_only: i64| format!("SELECT \"{s}\".sweep(5000, 1000, {try_only})");
    let tombstones = format!("SELECT count(*) FROM \"{s}\".locks");
    let mut first = PgConnection::connect(&url).await.unwrap();
    first.execute(sqlx::raw_sql("BEGIN")).await.unwrap();
    let row = first.fetch_one(sqlx::raw_sql(&sweep(1))).await.unwrap();
    assert_eq!(
        row.get::<i64, _>(0),
        2000,
        "one batch: 1,000 tombstones, 1,000 records"
    );
    assert_eq!(
        number(&pool, &sweep(1)).await,
        -1,
        "the second node leaves the work to the first"
    );
    assert_eq!(
        number(&pool, &tombstones).await,
        3000,
        "and deleted nothing"
    );
    first.execute(sqlx::raw_sql("COMMIT")).await.unwrap();
    assert_eq!(number(&pool, &tombstones).await, 2000);

    // Four nodes by hand at once: each waits for the others' batches; every row goes once.
    let nodes: Vec<PostgresBackend> = {
        let mut nodes = Vec::new();
        for _ in 0..4 {
            nodes.push(
                PostgresBackend::builder(url.clone())
                    .schema(&s)
                    .pool_size(1)
                    .build()
                    .await
                    .unwrap(),
            );
        }
        nodes
    };
    // (Their background sweepers start with a sweep too: the work is shared with those.)
    let swept = futures_util::future::join_all(nodes.iter().map(PostgresBackend::sweep)).await;
    let total: u64 = swept.into_iter().map(Result::unwrap).sum();
    assert!(total <= 4000, "each row deleted once: {total}");
    assert_eq!(number(&pool, &tombstones).await, 0);
    assert!(nodes.iter().all(|n| n.failed_sweeps() == 0));
}

/// 100,000 rows: half tombstones released an hour ago (and as many expired records), half
/// live leases. One `sweep()` deletes the expired ones, batch by batch, and leaves the live
/// ones; a sweep then finds nothing. The expired rows are found by the expiry index (the
/// plan of the sweep's query names it), not by reading the table, however many times a
/// session sweeps (ten sweeps on one session read it never).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_table_sweeps_in_batches_and_leaves_nothing_expired() {
    let backend = backend(url().await, None, "sweep_large").await;
    let s = backend.schema().to_owned();
    fill(backend.pool(), &s, "k", 50_000, 50_000).await;
    let plan = backend
        .pool()
        .fetch_all(sqlx::raw_sql(&format!(
            "EXPLAIN SELECT key FROM \"{s}\".locks
               WHERE greatest(expires_at, shared_until) < clock_timestamp() AND NOT queued
               ORDER BY greatest(expires_at, shared_until) LIMIT 1000"
        )))
        .await
        .unwrap()
        .iter()
        .map(|row| row.get::<String, _>(0))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(plan.contains("locks_expiry"), "by the expiry index: {plan}");
    // A pooled session calls the sweep again and again: its cached plans must keep to the
    // indexes (a generic plan sorted the whole table). Ten calls on one session, in one
    // transaction, whose own statistics count the table's sequential scans.
    let mut session = backend.pool().acquire().await.unwrap();
    let scans = format!(
        "SELECT seq_scan FROM pg_stat_xact_user_tables WHERE relid = '\"{s}\".locks'::regclass"
    );
    session.execute(sqlx::raw_sql("BEGIN")).await.unwrap();
    for _ in 0..10 {
        session
            .execute(sqlx::raw_sql(&format!(
                "SELECT \"{s}\".sweep(3600000 * 24, 1000, 0)"
            )))
            .await
            .unwrap();
    }
    let row = session.fetch_one(sqlx::raw_sql(&scans)).await.unwrap();
    assert_eq!(
        row.get::<i64, _>(0),
        0,
        "no sweep read the whole lock table"
    );
    session.execute(sqlx::raw_sql("ROLLBACK")).await.unwrap();
    drop(session);
    // (The node's background sweeper may share the work, batch by batch.)
    let swept = backend.sweep().await.unwrap();
    assert!(swept <= 100_000, "{swept} rows swept");
    assert_eq!(
        number(
            backend.pool(),
            &format!("SELECT count(*) FROM \"{s}\".locks WHERE expires_at < clock_timestamp()")
        )
        .await,
        0,
        "nothing expired left"
    );
    assert_eq!(
        number(
            backend.pool(),
            &format!("SELECT count(*) FROM \"{s}\".records")
        )
        .await,
        0
    );
    assert_eq!(
        number(
            backend.pool(),
            &format!("SELECT count(*) FROM \"{s}\".locks")
        )
        .await,
        50_000,
        "the live leases stay"
    );
    assert_eq!(backend.sweep().await.unwrap(), 0, "nothing to do");
}
