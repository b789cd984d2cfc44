//! A statement PgBouncer gave up on (`query_timeout`: it sends the client `FATAL 08P01`
//! and closes the server connection) may still run and commit on the server: a
//! compare-and-set whose first send waited on a lock and applied after the pooler's
//! timeout is not sent again, so the engine never reports it as failed while its value
//! is stored.

use std::time::Duration;

use tower_lock::engine::{
    Compare, LockKey, NumericAction, NumericBackend, NumericOp,
    postgres::{
        PostgresBackend,
        sqlx::{self, Executor, Row, postgres::PgPoolOptions},
    },
};
use tower_lock_test_support::postgres::{PgBouncer, PostgresServer};

use crate::harness::unique_schema;

fn raise_to(value: f64) -> NumericOp {
    NumericOp {
        compare: Compare::Greater,
        value,
        epsilon: 0.0,
        action: NumericAction::Set { ttl: None },
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compare_and_set_the_pooler_timed_out_is_not_sent_again() {
    let (bouncer, direct) = tokio::task::spawn_blocking(|| {
        let server = PostgresServer::shared();
        (
            PgBouncer::configured(server, &[("query_timeout", "1")]),
            server.url(),
        )
    })
    .await
    .unwrap();
    let schema = unique_schema("query_timeout");
    let builder = PostgresBackend::builder(bouncer.url()).schema(&schema);
    builder.migrate().await.unwrap();
    let backend = std::sync::Arc::new(builder.listen_url(direct.clone()).build().await.unwrap());
    let key = LockKey::new("n").unwrap();
    assert!(backend.compare_and_set(&key, &raise_to(1.0)).await.unwrap());

    // A session of its own holds the value's row: the raise through the pooler waits on
    // it past the pooler's `query_timeout`.
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .connect(&direct)
        .await
        .unwrap();
    let mut holder = pool.begin().await.unwrap();
    (&mut *holder)
        .execute(format!("SELECT * FROM \"{schema}\".numbers FOR UPDATE").as_str())
        .await
        .unwrap();
    let raise = tokio::spawn({
        let backend = backend.clone();
        let key = key.clone();
        async move { backend.compare_and_set(&key, &raise_to(2.0)).await }
    });
    // Released once the call has answered (the fix: an error at the pooler's timeout) or
    // has sent its statement a second time (two sessions waiting on the row).
    let waiting = format!(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'
            AND query LIKE '%{schema}%compare_and_set%'"
    );
    loop {
        if raise.is_finished() {
            break;
        }
        let waiters: i64 = sqlx::raw_sql(&waiting)
            .fetch_one(&pool)
            .await
            .unwrap()
            .get(0);
        if waiters >= 2 {
            break;
        }
    }
    holder.rollback().await.unwrap();
    let answered = tokio::time::timeout(Duration::from_secs(10), raise)
        .await
        .expect("the raise answered")
        .unwrap();
    // The first send commits once the row is free (the server never learnt that the
    // pooler had left).
    let stored = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            let stored: f64 = sqlx::raw_sql(&format!(
                "SELECT value FROM \"{schema}\".numbers WHERE key = 'n'"
            ))
            .fetch_one(&pool)
            .await
            .unwrap()
            .get(0);
            if stored == 2.0 || answered.is_ok() {
                break stored;
            }
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the first send committed");
    match answered {
        // Sent again, the raise finds its own value: "not applied", while it was.
        Ok(applied) => assert_eq!(
            applied,
            stored == 2.0,
            "answered {applied}, stored {stored}"
        ),
        // "May have run": the caller is told it does not know, which is true.
        Err(error) => assert_eq!(stored, 2.0, "{error}"),
    }
}
