//! Crashes with real processes: a server process SIGKILLed while its handler runs, or
//! after the commit but before its answer was written; Postgres restarted mid-request.
//! Counted in the payments table.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::Arc,
    time::Duration,
};

use axum::{extract::Request, middleware::Next, response::Response};
use http::StatusCode;
use tokio::{io::AsyncWriteExt, net::TcpStream};
use tower_lock_test_support::{http::serve, postgres::PostgresServer};

use crate::{
    app::{Db, Gate, post, router, shared_url},
    behaviour::raw_post,
};

/// The server the child process runs when `TXN_CHILD` is set (`url|schema|port|mark`):
/// the test app, which writes `<mark>.entered` once a handler inserted its row, and, for
/// a request with `x-die-after-commit`, writes `<mark>.committed` once the layer
/// committed and then never answers. Without `TXN_CHILD` it does nothing.
#[test]
fn child_server() {
    let Ok(spec) = std::env::var("TXN_CHILD") else {
        return;
    };
    let [url, schema, port, mark]: [String; 4] = spec
        .split('|')
        .map(str::to_owned)
        .collect::<Vec<_>>()
        .try_into()
        .unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let db = Db::existing(&url, schema, false).await;
        let (gate, mut entered) = Gate::new();
        let entered_mark = format!("{mark}.entered");
        tokio::spawn(async move {
            while entered.recv().await.is_some() {
                std::fs::write(&entered_mark, b"entered").unwrap();
            }
        });
        let layer = db.layer(|b| b.wait(Duration::from_secs(20))).await;
        let committed = Arc::new(format!("{mark}.committed"));
        let app = router(&db, layer, gate).layer(axum::middleware::from_fn(
            move |req: Request, next: Next| {
                let committed = committed.clone();
                async move { die_after_commit(&committed, req, next).await }
            },
        ));
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port.parse::<u16>().unwrap()))
            .await
            .unwrap();
        axum::serve(listener, app).await.unwrap();
    });
}

/// Outside the layer: the layer's answer arrives after its commit; for a request marked
/// `x-die-after-commit`, say so and never write it.
async fn die_after_commit(mark: &str, req: Request, next: Next) -> Response {
    let die = req.headers().contains_key("x-die-after-commit");
    let res = next.run(req).await;
    if die {
        std::fs::write(mark, b"committed").unwrap();
        std::future::pending::<()>().await;
    }
    res
}

/// This test binary run again as the [`child_server`] on a free port; returns once it
/// accepts connections.
async fn child(db: &Db, mark: &Path) -> (Child, u16) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let spec = format!(
        "{}|{}|{port}|{}",
        shared_url().await,
        db.schema,
        mark.display()
    );
    // libtest names a test by its module path, without the crate's name.
    let module = module_path!()
        .split_once("::")
        .map_or(module_path!(), |(_, m)| m);
    let child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            &format!("{module}::child_server"),
            "--nocapture",
            "--test-threads=1",
        ])
        .env("TXN_CHILD", spec)
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn the child server");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while TcpStream::connect(("127.0.0.1", port)).await.is_err() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the child server never listened"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (child, port)
}

/// Waits until the child wrote `path`.
async fn until_written(path: &Path) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !path.exists() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} never written",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn mark(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("tower-lock-txn-{name}-{}", std::process::id()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_killed_while_its_handler_runs_leaves_nothing_and_the_retry_commits_once() {
    let db = Db::new(&shared_url().await, "killed_running").await;
    let mark = mark("running");
    let (mut child, port) = child(&db, &mark).await;
    let mut stream = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    stream
        .write_all(raw_post("k", "hang").as_bytes())
        .await
        .unwrap();
    until_written(&mark.with_extension("entered")).await;
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!((db.payments().await, db.records().await), (0, 0));
    let (gate, _entered) = Gate::new();
    let layer = db.layer(|b| b.wait(Duration::from_secs(20))).await;
    let server = serve(router(&db, layer, gate)).await;
    let retry = post(&server, "k", "ok", "card").await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert_eq!(retry.header("idempotent-replayed"), None);
    assert_eq!((db.payments().await, db.records().await), (1, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_killed_after_the_commit_before_its_answer_is_replayed_without_a_second_row() {
    let db = Db::new(&shared_url().await, "killed_committed").await;
    let mark = mark("committed");
    let (mut child, port) = child(&db, &mark).await;
    let mut stream = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let request = raw_post("k", "ok").replacen("\r\n\r\n", "\r\nx-die-after-commit: 1\r\n\r\n", 1);
    stream.write_all(request.as_bytes()).await.unwrap();
    until_written(&mark.with_extension("committed")).await;
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!((db.payments().await, db.records().await), (1, 1));
    let (gate, _entered) = Gate::new();
    let server = serve(router(&db, db.layer(|b| b).await, gate)).await;
    let retry = post(&server, "k", "ok", "card").await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert_eq!(retry.header("idempotent-replayed"), Some("true"));
    assert_eq!(db.payments().await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_restarted_mid_request_is_an_error_answer_and_a_clean_retry() {
    let server = tokio::task::spawn_blocking(|| Arc::new(PostgresServer::start()))
        .await
        .unwrap();
    let db = Db::new(&server.url(), "restarted").await;
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
    assert_eq!((db.payments().await, db.records().await), (0, 0));
    let retry = post(&app, "k", "ok", "card").await;
    assert_eq!(retry.status, StatusCode::CREATED, "{}", retry.text());
    assert_eq!(db.payments().await, 1);
}
