//! A client that leaves never cancels its request: over a real socket, on axum and on
//! actix-web, a client that disconnects while its handler runs leaves the request running
//! on a task of its own to its commit (the row and the record), and the retry is
//! replayed. A handler that panics after its client left still rolls back. A
//! `tower::timeout` outside the layer answers the client without cancelling the request;
//! a deadline inside the layer (between it and the handler) rolls it back.

use std::time::Duration;

use axum::{
    Extension, Router, error_handling::HandleErrorLayer, http::StatusCode, routing::post as route,
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    sync::mpsc,
};
use tower::{ServiceBuilder, ServiceExt, timeout::TimeoutLayer};
use tower_lock_test_support::http::{TestServer, serve};

use crate::{
    actix::gated_actix_server,
    app::{Db, Gate, Schema, pay, post, router, shared_url},
    behaviour::raw_post,
};

/// Waits until `db` has `payments` rows and `records` records, as another connection sees
/// them.
async fn until_committed(db: &Db, payments: i64, records: i64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let seen = (db.payments().await, db.records().await);
        if seen == (payments, records) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "(payments, records) never became ({payments}, {records}): {seen:?}"
        );
        tokio::task::yield_now().await;
    }
}

/// Sends `x-outcome: outcome` for key `k` on a raw connection, waits until its handler
/// inserted its row, then disconnects. On axum the client half-closes and reads to the end:
/// hyper reads the end of the stream, drops the request's future and closes its side. actix
/// notices a closed connection only when it next writes (actix-web#1313): the client just
/// leaves.
async fn leave_mid_handler(
    server: &TestServer,
    entered: &mut mpsc::UnboundedReceiver<String>,
    outcome: &str,
    axum: bool,
) {
    let mut stream = server.raw(&raw_post("k", outcome)).await;
    entered.recv().await.unwrap();
    if axum {
        stream.shutdown().await.unwrap();
        let mut buf = [0u8; 256];
        while matches!(stream.read(&mut buf).await, Ok(n) if n > 0) {}
    } else {
        drop(stream);
    }
}

/// The client leaves mid-handler; the handler is released, commits its row with the
/// record, and the retry is replayed: one row.
async fn a_client_that_left_runs_on_to_its_commit(
    server: TestServer,
    db: &Db,
    gate: Gate,
    mut entered: mpsc::UnboundedReceiver<String>,
    axum: bool,
) {
    leave_mid_handler(&server, &mut entered, "hang", axum).await;
    gate.release.notify_one();
    until_committed(db, 1, 1).await;
    let retry = post(&server, "k", "ok", "card").await;
    assert_eq!(retry.status, StatusCode::CREATED, "{}", retry.text());
    assert_eq!(retry.header("idempotent-replayed"), Some("true"));
    assert_eq!((db.payments().await, db.records().await), (1, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn axum_a_client_that_left_mid_handler_runs_on_to_its_commit_and_its_retry_is_replayed() {
    let db = Db::new(&shared_url().await, "left_axum").await;
    let (gate, entered) = Gate::new();
    let layer = db.layer(|b| b.wait(Duration::from_secs(20))).await;
    let server = serve(router(&db, layer, gate.clone())).await;
    a_client_that_left_runs_on_to_its_commit(server, &db, gate, entered, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn actix_a_client_that_left_mid_handler_runs_on_to_its_commit_and_its_retry_is_replayed() {
    let db = Db::new(&shared_url().await, "left_actix").await;
    let (gate, entered) = Gate::new();
    let server = gated_actix_server(&db, gate.clone()).await;
    a_client_that_left_runs_on_to_its_commit(server, &db, gate, entered, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_panics_after_its_client_left_rolls_back_and_the_retry_runs() {
    let db = Db::new(&shared_url().await, "left_panic").await;
    let (gate, mut entered) = Gate::new();
    let layer = db.layer(|b| b.wait(Duration::from_secs(20))).await;
    let server = serve(router(&db, layer, gate.clone())).await;
    leave_mid_handler(&server, &mut entered, "hang-panic", true).await;
    gate.release.notify_one();
    // The retry's claim waits on the unique index until the panicked request's transaction
    // has rolled back, then runs.
    let retry = post(&server, "k", "ok", "card").await;
    assert_eq!(retry.status, StatusCode::CREATED, "{}", retry.text());
    assert_eq!(retry.header("idempotent-replayed"), None);
    assert_eq!((db.payments().await, db.records().await), (1, 1));
}

/// `POST /payments` ([`pay`]) under `deadline` inside the transactional layer of `db`: an
/// elapsed deadline drops the handler and answers `408`.
async fn timed_app(db: &Db, gate: Gate, deadline: Duration) -> Router {
    let layer = db.layer(|b| b.wait(Duration::from_secs(20))).await;
    let handler = route(pay).layer(
        ServiceBuilder::new()
            .layer(HandleErrorLayer::new(|_: tower::BoxError| async {
                StatusCode::REQUEST_TIMEOUT
            }))
            .layer(TimeoutLayer::new(deadline)),
    );
    Router::new()
        .route("/payments", handler)
        .layer(layer)
        .layer(Extension(Schema(db.schema.clone())))
        .layer(Extension(gate))
}

fn request(outcome: &str) -> http::Request<axum::body::Body> {
    http::Request::post("/payments")
        .header("idempotency-key", "k")
        .header("x-outcome", outcome)
        .body(axum::body::Body::from("card"))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_outside_the_layer_answers_while_the_request_runs_on_and_one_inside_rolls_back() {
    // Outside: the timeout answers its caller, the request runs on to its commit, and the
    // retry is replayed.
    let db = Db::new(&shared_url().await, "timeout_outside").await;
    let (gate, mut entered) = Gate::new();
    let app = timed_app(&db, gate.clone(), Duration::from_secs(60)).await;
    let outside = ServiceBuilder::new()
        .timeout(Duration::from_secs(2))
        .service(app.clone());
    let timed_out = outside.oneshot(request("hang")).await;
    assert!(timed_out.is_err(), "the outside timeout answered");
    entered
        .try_recv()
        .expect("the handler ran before the timeout");
    gate.release.notify_one();
    until_committed(&db, 1, 1).await;
    let retry = app.oneshot(request("ok")).await.unwrap();
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");

    // Inside: the deadline drops the handler, its `408` rolls back, and the retry runs.
    let db = Db::new(&shared_url().await, "timeout_inside").await;
    let (gate, mut entered) = Gate::new();
    let app = timed_app(&db, gate, Duration::from_secs(1)).await;
    let timed_out = app.clone().oneshot(request("hang")).await.unwrap();
    assert_eq!(timed_out.status(), StatusCode::REQUEST_TIMEOUT);
    entered
        .try_recv()
        .expect("the handler ran before its deadline");
    assert_eq!((db.payments().await, db.records().await), (0, 0));
    let retry = app.oneshot(request("ok")).await.unwrap();
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert!(retry.headers().get("idempotent-replayed").is_none());
    assert_eq!((db.payments().await, db.records().await), (1, 1));
}
