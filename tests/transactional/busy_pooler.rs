//! Every statement the layer sends, through a PgBouncer in transaction mode whose two
//! server connections other clients keep busy: consecutive transactions of one client, and
//! the two halves (`Parse … Sync`, `Bind/Execute … Sync`) of an extended-protocol statement
//! sent outside a transaction, then reach different server connections.

use std::time::Duration;

use http::StatusCode;
use tower_lock::sqlx;
use tower_lock_test_support::{
    http::serve,
    postgres::{BusyClients, PgBouncer, PostgresServer},
};

use crate::app::{Db, Gate, post, router};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_a_busy_pgbouncer_of_two_connections_every_statement_and_the_sweep_work() {
    let (bouncer, _busy) = tokio::task::spawn_blocking(|| {
        let bouncer = PgBouncer::with_pool_size(PostgresServer::shared(), 2);
        let busy = BusyClients::start(&bouncer.url(), 4, Duration::from_millis(2));
        (bouncer, busy)
    })
    .await
    .unwrap();
    // Migration, the schema check at build.
    let db = Db::new(&bouncer.url(), "busy_pooler").await;
    let layer = db.layer(|b| b.retention(Duration::from_millis(1))).await;
    let server = serve(router(&db, layer.clone(), Gate::new().0)).await;
    for i in 0..10 {
        let key = format!("k{i}");
        // The claim, the handler's insert, the completion and its commit.
        assert_eq!(
            post(&server, &key, "ok", "card").await.status,
            StatusCode::CREATED
        );
        // A rollback.
        let failed = post(&server, &format!("f{i}"), "fail", "card").await;
        assert_eq!(failed.status, StatusCode::INTERNAL_SERVER_ERROR);
    }
    assert_eq!(db.payments().await, 10);
    // Every record has expired (retention 1 ms): each sweep deletes what is left, and one
    // whose halves were split across server connections fails.
    for _ in 0..20 {
        layer
            .sweep()
            .await
            .expect("a sweep through a busy PgBouncer in transaction mode");
    }
    assert_eq!(db.records().await, 0);
    assert_eq!(layer.failed_sweeps(), 0);
    // A sweep that fails (here the column it reads is gone) is an error, and counted.
    sqlx::raw_sql(&format!(
        "ALTER TABLE {}.tower_lock_idempotency_records RENAME COLUMN expires_at TO gone",
        db.schema
    ))
    .execute(&db.pool)
    .await
    .unwrap();
    layer.sweep().await.expect_err("the sweep's column is gone");
    assert_eq!(layer.failed_sweeps(), 1);
}
