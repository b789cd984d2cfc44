//! What a crash of the database keeps although the lock functions commit asynchronously: a
//! record stored with `Lease::complete` commits synchronously, so a stored response is
//! there after a `kill -9` of every server process right after it was stored, lock
//! operations of others in flight or not.

use std::time::Duration;

use bytes::Bytes;
use tower_lock::engine::{LockEngine, LockKey, Record, postgres::PostgresBackend};
use tower_lock_test_support::postgres::PostgresServer;

use crate::harness::unique_schema;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_record_survives_a_kill_9_crash_right_after_it_was_stored() {
    const RECORDS: usize = 16;
    let server = std::sync::Arc::new(
        tokio::task::spawn_blocking(PostgresServer::start)
            .await
            .unwrap(),
    );
    let builder = PostgresBackend::builder(server.url())
        .schema(unique_schema("durable"))
        .command_timeout(Duration::from_secs(5));
    builder.migrate().await.unwrap();
    let engine = LockEngine::new(builder.clone().build().await.unwrap());
    for i in 0..RECORDS {
        // Lock operations (asynchronous commits) before and between the records.
        for j in 0..4 {
            let lease = engine
                .lock(format!("other{i}.{j}"))
                .acquire()
                .await
                .unwrap();
            lease.release().await.unwrap();
        }
        let lease = engine.lock(format!("r{i}")).acquire().await.unwrap();
        let body = Bytes::from(format!("response {i}"));
        let record = Record::new(Bytes::from_static(b"fp"), Bytes::from_static(b"m"), body);
        lease
            .complete(record, Duration::from_secs(600))
            .await
            .unwrap();
    }
    let down = server.clone();
    tokio::task::spawn_blocking(move || {
        down.crash();
        down.restart();
    })
    .await
    .unwrap();
    let engine = LockEngine::new(builder.build().await.unwrap());
    for i in 0..RECORDS {
        let key = LockKey::new(format!("r{i}")).unwrap();
        let record = engine
            .record(&key)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("record r{i} was lost in the crash"));
        assert_eq!(record.body, Bytes::from(format!("response {i}")));
    }
}
