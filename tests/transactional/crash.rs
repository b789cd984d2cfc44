//! Crashes with real processes: a server process SIGKILLed while its handler runs, or
//! after the commit but before its answer was written; Postgres restarted mid-request.
//! Counted in the payments table.

use std::{sync::Arc, time::Duration};

use http::StatusCode;
use tokio::{io::AsyncWriteExt, net::TcpStream};
use tower_lock::sqlx;
use tower_lock_test_support::{
    http::{TestServer, serve},
    postgres::{PgBouncer, PostgresServer},
};

use crate::{
    actix::actix_server,
    app::{Db, Gate, post, router, shared_url},
    behaviour::raw_post,
    child::{ChildApp, ChildServer, mark, until_written},
};

/// Killed while its handler runs, every connection through `url`: nothing is left, and the
/// retry commits once.
async fn killed_while_running(app: ChildApp, url: &str, name: &str) {
    let db = Db::new(url, name).await;
    let mark = mark(name);
    let mut child = ChildServer::start(app, url, &db, &mark).await;
    let mut stream = TcpStream::connect(("127.0.0.1", child.port()))
        .await
        .unwrap();
    stream
        .write_all(raw_post("k", "hang").as_bytes())
        .await
        .unwrap();
    until_written(&mark.with_extension("entered")).await;
    child.kill();
    assert_eq!((db.payments().await, db.records().await), (0, 0));
    let server = retry_server(app, &db).await;
    let retry = post(&server, "k", "ok", "card").await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert_eq!(retry.header("idempotent-replayed"), None);
    assert_eq!((db.payments().await, db.records().await), (1, 1));
}

/// Killed after the commit, before its answer, every connection through `url`: the retry is
/// replayed, without a second row.
async fn killed_after_the_commit(app: ChildApp, url: &str, name: &str) {
    let db = Db::new(url, name).await;
    let mark = mark(name);
    let mut child = ChildServer::start(app, url, &db, &mark).await;
    let mut stream = TcpStream::connect(("127.0.0.1", child.port()))
        .await
        .unwrap();
    let request = raw_post("k", "ok").replacen("\r\n\r\n", "\r\nx-die-after-commit: 1\r\n\r\n", 1);
    stream.write_all(request.as_bytes()).await.unwrap();
    until_written(&mark.with_extension("committed")).await;
    child.kill();
    assert_eq!((db.payments().await, db.records().await), (1, 1));
    let server = retry_server(app, &db).await;
    let retry = post(&server, "k", "ok", "card").await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert_eq!(retry.header("idempotent-replayed"), Some("true"));
    assert_eq!(db.payments().await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_killed_while_its_handler_runs_leaves_nothing_and_the_retry_commits_once() {
    killed_while_running(ChildApp::Payments, &shared_url().await, "killed_running").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_pgbouncer_a_server_killed_while_its_handler_runs_leaves_nothing() {
    let bouncer = bouncer().await;
    killed_while_running(ChildApp::Payments, &bouncer.url(), "killed_running_bouncer").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_killed_after_the_commit_before_its_answer_is_replayed_without_a_second_row() {
    killed_after_the_commit(ChildApp::Payments, &shared_url().await, "killed_committed").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_pgbouncer_a_server_killed_after_the_commit_is_replayed_without_a_second_row() {
    let bouncer = bouncer().await;
    killed_after_the_commit(
        ChildApp::Payments,
        &bouncer.url(),
        "killed_committed_bouncer",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_actix_server_killed_while_its_handler_runs_leaves_nothing() {
    killed_while_running(ChildApp::Actix, &shared_url().await, "actix_running").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_actix_server_killed_after_the_commit_is_replayed_without_a_second_row() {
    killed_after_the_commit(ChildApp::Actix, &shared_url().await, "actix_committed").await;
}

/// The server a retry goes to, of the framework `app` runs on.
async fn retry_server(app: ChildApp, db: &Db) -> TestServer {
    match app {
        ChildApp::Actix => actix_server(db).await,
        _ => {
            let (gate, _entered) = Gate::new();
            let layer = db.layer(|b| b.wait(Duration::from_secs(20))).await;
            serve(router(db, layer, gate)).await
        }
    }
}

/// A PgBouncer in transaction mode in front of the shared server.
async fn bouncer() -> PgBouncer {
    tokio::task::spawn_blocking(|| PgBouncer::start(PostgresServer::shared()))
        .await
        .unwrap()
}

/// Postgres of the test's own restarted while a handler runs, every connection through a
/// PgBouncer in transaction mode in front of it if `bounced`: the request is an error
/// answer, nothing is left, and the retry commits once.
async fn restarted_mid_request(bounced: bool, name: &str) {
    let (server, bouncer) = tokio::task::spawn_blocking(move || {
        let server = Arc::new(PostgresServer::start());
        let bouncer = bounced.then(|| PgBouncer::start(&server));
        (server, bouncer)
    })
    .await
    .unwrap();
    let url = bouncer
        .as_ref()
        .map_or_else(|| server.url(), PgBouncer::url);
    let db = Db::new(&url, name).await;
    let (gate, mut entered) = Gate::new();
    let app = Arc::new(serve(router(&db, db.layer(|b| b).await, gate.clone())).await);
    let first = tokio::spawn({
        let app = app.clone();
        async move { post(&app, "k", "hang", "card").await }
    });
    entered.recv().await.unwrap();
    let restarting = server.clone();
    tokio::task::spawn_blocking(move || restarting.restart())
        .await
        .unwrap();
    gate.release.notify_one();
    let first = first.await.unwrap();
    assert_eq!(
        first.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        first.text()
    );
    assert!(first.header("retry-after").is_some());
    // A PgBouncer whose logins failed during the restart waits `server_login_retry` (1 s
    // here) before it tries the server again.
    let back = tokio::time::Instant::now() + Duration::from_secs(10);
    while sqlx::raw_sql("SELECT 1").execute(&db.pool).await.is_err() {
        assert!(
            tokio::time::Instant::now() < back,
            "the database never came back"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!((db.payments().await, db.records().await), (0, 0));
    let retry = post(&app, "k", "ok", "card").await;
    assert_eq!(retry.status, StatusCode::CREATED, "{}", retry.text());
    assert_eq!(db.payments().await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_restarted_mid_request_is_an_error_answer_and_a_clean_retry() {
    restarted_mid_request(false, "restarted").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_pgbouncer_postgres_restarted_mid_request_is_an_error_and_a_clean_retry() {
    restarted_mid_request(true, "restarted_pgb").await;
}
