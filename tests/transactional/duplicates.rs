//! Twenty concurrent duplicates from two server processes (each with its own pool, one
//! database), directly and through PgBouncer in transaction mode: one row.

use http::StatusCode;
use tower_lock_test_support::postgres::{PgBouncer, PostgresServer};

use crate::{
    app::{Db, shared_url},
    behaviour::until_waiting_on_locks,
    child::{ChildApp, ChildServer, mark, request, send},
};

/// Twenty `POST`s with one key, alternately to two child servers on `url` whose layers
/// wait 20 s: the first holds its claim (its handler waits for the gate) until the other
/// nineteen wait on the records table's unique index; then every answer is the first's
/// committed response, nineteen of them replayed (none waits out its 20 s: no `409`), and
/// the payments table has one row.
async fn twenty_duplicates_from_two_processes(url: &str, name: &str) {
    let db = Db::new(&shared_url().await, name).await;
    let children = [
        ChildServer::start(ChildApp::Payments, url, &db, &mark(&format!("{name}-a"))).await,
        ChildServer::start(ChildApp::Payments, url, &db, &mark(&format!("{name}-b"))).await,
    ];
    let headers = [("idempotency-key", "k"), ("x-outcome", "hang")];
    let requests: Vec<_> = (0..20)
        .map(|i| {
            let port = children[i % 2].port();
            let request = request("/payments", &headers, "card");
            tokio::spawn(async move { send(port, &request).await })
        })
        .collect();
    until_waiting_on_locks(&db, 19).await;
    for child in &children {
        child.release().await;
    }
    let mut answers = Vec::new();
    for request in requests {
        answers.push(request.await.unwrap());
    }
    let (replayed, first): (Vec<_>, Vec<_>) = answers
        .iter()
        .partition(|a| a.header("idempotent-replayed") == Some("true"));
    assert_eq!((first.len(), replayed.len()), (1, 19), "{answers:#?}");
    for answer in &answers {
        assert_eq!(answer.status, StatusCode::CREATED, "{answer:#?}");
        assert_eq!(answer.body, first[0].body);
    }
    assert_eq!((db.payments().await, db.records().await), (1, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_concurrent_duplicates_from_two_server_processes_insert_one_row() {
    twenty_duplicates_from_two_processes(&shared_url().await, "twenty").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_concurrent_duplicates_from_two_processes_through_pgbouncer_insert_one_row() {
    let bouncer = tokio::task::spawn_blocking(|| PgBouncer::start(PostgresServer::shared()))
        .await
        .unwrap();
    twenty_duplicates_from_two_processes(&bouncer.url(), "twenty_bouncer").await;
}
