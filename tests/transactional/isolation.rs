//! A database whose default isolation is `serializable` or `repeatable read` (`ALTER
//! DATABASE … SET default_transaction_isolation`, as teams set it): the handler's
//! transaction keeps that level, and a duplicate that waited on the first request's claim
//! still gets the replay when the first commits (its claim's serialization failure is a
//! wait that ended, claimed again in a fresh transaction), never a `503`.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU32, Ordering},
    },
    time::Duration,
};

use http::StatusCode;
use tower_lock::sqlx::{self, Row};
use tower_lock_test_support::{http::serve, postgres::PostgresServer};

use crate::{
    app::{Db, Gate, post, router},
    behaviour::until_waiting_on_locks,
};

/// A fresh database of the shared cluster, owned by the test role, whose default
/// isolation is `level`: its address.
async fn database_at(level: &'static str) -> String {
    static MADE: AtomicU32 = AtomicU32::new(0);
    let name = format!(
        "iso_{}_{}_{}",
        level.replace(' ', "_"),
        std::process::id(),
        MADE.fetch_add(1, Ordering::Relaxed)
    );
    tokio::task::spawn_blocking(move || {
        let server = PostgresServer::shared();
        // Two messages: `CREATE DATABASE` cannot run in a multi-statement one.
        server.psql(&format!("CREATE DATABASE {name} OWNER tower_lock"));
        server.psql(&format!(
            "ALTER DATABASE {name} SET default_transaction_isolation = '{level}'"
        ));
        let url = server.url();
        let (base, _) = url.rsplit_once('/').expect("a database in the address");
        format!("{base}/{name}")
    })
    .await
    .unwrap()
}

/// A first request holds its claim (its handler waits for the gate) while five duplicates
/// wait on the records table's unique index (`wait` 20 s); once it commits, every
/// duplicate is answered its response, replayed, and the payments table has one row.
async fn duplicates_waiting_under(level: &'static str) {
    let url = database_at(level).await;
    let db = Db::new(&url, "iso").await;
    let seen: String = sqlx::raw_sql("SHOW transaction_isolation")
        .fetch_one(&db.pool)
        .await
        .unwrap()
        .get(0);
    assert_eq!(seen, level, "the database's default");
    let (gate, mut entered) = Gate::new();
    let layer = db.layer(|b| b.wait(Duration::from_secs(20))).await;
    let server = Arc::new(serve(router(&db, layer, gate.clone())).await);
    let first = tokio::spawn({
        let server = Arc::clone(&server);
        async move { post(&server, "k", "hang", "card").await }
    });
    entered.recv().await.unwrap();
    let duplicates: Vec<_> = (0..5)
        .map(|_| {
            let server = Arc::clone(&server);
            tokio::spawn(async move { post(&server, "k", "hang", "card").await })
        })
        .collect();
    until_waiting_on_locks(&db, 5).await;
    gate.release.notify_one();
    let first = first.await.unwrap();
    assert_eq!(first.status, StatusCode::CREATED, "{}", first.text());
    for duplicate in duplicates {
        let duplicate = duplicate.await.unwrap();
        assert_eq!(
            (duplicate.status, duplicate.header("idempotent-replayed")),
            (StatusCode::CREATED, Some("true")),
            "{level}: {}",
            duplicate.text()
        );
        assert_eq!(duplicate.body, first.body);
    }
    assert_eq!((db.payments().await, db.records().await), (1, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_default_serializable_waiting_duplicates_get_the_replay() {
    duplicates_waiting_under("serializable").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_default_repeatable_read_waiting_duplicates_get_the_replay() {
    duplicates_waiting_under("repeatable read").await;
}
