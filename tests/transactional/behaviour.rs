//! The protocol on one server: claim, replay, `422`, `409`; what rolls back; tombstones;
//! a duplicate in flight; retention.

use std::{future::Future, time::Duration};

use http::StatusCode;
use tokio::io::AsyncReadExt;
use tower::{Service, ServiceExt, service_fn};
use tower_lock::{
    idempotency::{RequestBody, transactional::LentTransaction},
    sqlx::{self, Row},
};
use tower_lock_test_support::http::serve;

use crate::app::{Db, Gate, post, router, shared_url};

/// The raw HTTP/1.1 request for `key` and `outcome`.
pub(crate) fn raw_post(key: &str, outcome: &str) -> String {
    format!(
        "POST /payments HTTP/1.1\r\nHost: test\r\nIdempotency-Key: {key}\r\nx-outcome: {outcome}\r\nContent-Length: 4\r\n\r\ncard"
    )
}

/// How many backends wait for a lock in a statement of the layer on `db`'s schema (which
/// the layer quotes: duplicates queued on its records table's unique index), whatever
/// other tests do meanwhile.
async fn waiting_on_locks(db: &Db) -> i64 {
    sqlx::query(
        "SELECT count(*) FROM pg_stat_activity
         WHERE wait_event_type = 'Lock' AND strpos(query, $1) > 0",
    )
    .persistent(false)
    .bind(format!("\"{}\".", db.schema))
    .fetch_one(&db.pool)
    .await
    .unwrap()
    .get(0)
}

/// Waits until `n` backends wait for a lock in a statement on `db`'s schema.
pub(crate) async fn until_waiting_on_locks(db: &Db, n: i64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let waiting = waiting_on_locks(db).await;
        if waiting >= n {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{waiting} of {n} waiting"
        );
        tokio::task::yield_now().await;
    }
}

/// Runs `request` to its end while watching `db`'s backends: its answer, and whether a
/// statement on `db`'s schema waited for a lock meanwhile.
async fn watching_lock_waits<T: Send + 'static>(
    db: &Db,
    request: impl Future<Output = T> + Send + 'static,
) -> (T, bool) {
    let request = tokio::spawn(request);
    let mut waited = false;
    while !request.is_finished() {
        waited |= waiting_on_locks(db).await > 0;
    }
    (request.await.unwrap(), waited)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_commits_its_row_with_the_record_and_its_retry_is_replayed() {
    let db = Db::new(&shared_url().await, "replayed").await;
    let (gate, _entered) = Gate::new();
    let server = serve(router(&db, db.layer(|b| b).await, gate)).await;
    let first = post(&server, "k1", "ok", "card 1").await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(first.header("idempotent-replayed"), None);
    let retry = post(&server, "k1", "ok", "card 1").await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert_eq!(retry.body, first.body);
    assert_eq!(retry.header("idempotent-replayed"), Some("true"));
    assert_eq!((db.payments().await, db.records().await), (1, 1));
}

/// Keys are written into the layer's statements as literals (dollar-quoted, or in hex when
/// they hold a `$`): quotes, dashes and dollar signs in a key are data, each key its
/// own, and each is replayed to its own retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_with_quoting_characters_run_once_each_and_are_replayed() {
    let db = Db::new(&shared_url().await, "quoting").await;
    let (gate, _entered) = Gate::new();
    let server = serve(router(&db, db.layer(|b| b).await, gate)).await;
    let keys = ["a'b", "$l$", "x$l$'); --", "$", "$$", "ab"];
    for (i, key) in keys.iter().enumerate() {
        let body = format!("card {i}");
        let first = post(&server, key, "ok", &body).await;
        assert_eq!(first.status, StatusCode::CREATED, "{key}");
        let retry = post(&server, key, "ok", &body).await;
        assert_eq!(retry.header("idempotent-replayed"), Some("true"), "{key}");
        assert_eq!(retry.body, first.body, "{key}");
    }
    let n = i64::try_from(keys.len()).unwrap();
    assert_eq!((db.payments().await, db.records().await), (n, n));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_reused_for_another_request_is_422_and_writes_nothing() {
    let db = Db::new(&shared_url().await, "mismatch").await;
    let (gate, _entered) = Gate::new();
    let server = serve(router(&db, db.layer(|b| b).await, gate)).await;
    assert_eq!(
        post(&server, "k", "ok", "card 1").await.status,
        StatusCode::CREATED
    );
    let other = post(&server, "k", "ok", "card 2").await;
    assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        other.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(db.payments().await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_in_flight_is_409_with_retry_after_without_a_wait() {
    let db = Db::new(&shared_url().await, "in_flight").await;
    let (gate, mut entered) = Gate::new();
    let server = std::sync::Arc::new(serve(router(&db, db.layer(|b| b).await, gate.clone())).await);
    let first = tokio::spawn({
        let server = server.clone();
        async move { post(&server, "k", "hang", "card").await }
    });
    entered.recv().await.unwrap();
    // Answered at once: the duplicate's claim never waits for the first's lock (a wait
    // would last its `lock_timeout`, at least 100 ms, long enough to be seen).
    let (duplicate, waited) = watching_lock_waits(&db, {
        let server = server.clone();
        async move { post(&server, "k", "hang", "card").await }
    })
    .await;
    assert_eq!(duplicate.status, StatusCode::CONFLICT);
    assert!(duplicate.header("retry-after").is_some());
    assert!(!waited, "the duplicate waited for a lock");
    gate.release.notify_one();
    assert_eq!(first.await.unwrap().status, StatusCode::CREATED);
    assert_eq!(db.payments().await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_that_mean_it_did_not_happen_roll_back_and_the_retry_runs() {
    let db = Db::new(&shared_url().await, "not_stored").await;
    let (gate, _entered) = Gate::new();
    let server = serve(router(&db, db.layer(|b| b).await, gate)).await;
    let invalid = post(&server, "k", "invalid", "card").await;
    assert_eq!(invalid.status, StatusCode::UNPROCESSABLE_ENTITY);
    let failed = post(&server, "k", "fail", "card").await;
    assert_eq!(failed.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!((db.payments().await, db.records().await), (0, 0));
    assert_eq!(
        post(&server, "k", "ok", "card").await.status,
        StatusCode::CREATED
    );
    assert_eq!(db.payments().await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_handler_rolls_back_and_the_retry_runs() {
    let db = Db::new(&shared_url().await, "panic").await;
    let (gate, _entered) = Gate::new();
    let layer = db.layer(|b| b.wait(Duration::from_secs(20))).await;
    let server = serve(router(&db, layer, gate)).await;
    let mut stream = server.raw(&raw_post("k", "panic")).await;
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer).await;
    assert!(
        !String::from_utf8_lossy(&answer).contains("201"),
        "no answer but a closed connection"
    );
    let retry = post(&server, "k", "ok", "card").await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert_eq!(retry.header("idempotent-replayed"), None);
    assert_eq!(db.payments().await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_error_rolls_back_and_the_retry_runs() {
    let db = Db::new(&shared_url().await, "error").await;
    let schema = db.schema.clone();
    let layer = db.layer(|b| b).await;
    let service = tower::ServiceBuilder::new()
        .layer(layer)
        .service(service_fn(
            move |req: http::Request<RequestBody<http_body_util::Full<bytes::Bytes>>>| {
                let schema = schema.clone();
                async move {
                    let lent = req.extensions().get::<LentTransaction>().unwrap().clone();
                    let mut tx = lent.borrow().await.unwrap();
                    sqlx::query(&format!(
                        "INSERT INTO {schema}.payments (note) VALUES ('x')"
                    ))
                    .persistent(false)
                    .execute(&mut *tx)
                    .await
                    .unwrap();
                    drop(tx);
                    if req.headers().contains_key("x-fail") {
                        return Err("the handler failed");
                    }
                    Ok(http::Response::new(http_body_util::Full::new(
                        bytes::Bytes::from("done"),
                    )))
                }
            },
        ));
    let request = |fail: bool| {
        let mut req = http::Request::post("/payments").header("idempotency-key", "k");
        if fail {
            req = req.header("x-fail", "1");
        }
        req.body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap()
    };
    let failed = service.clone().oneshot(request(true)).await;
    assert!(failed.is_err());
    assert_eq!((db.payments().await, db.records().await), (0, 0));
    let mut service = service;
    let ok = service.ready().await.unwrap().call(request(false)).await;
    assert_eq!(ok.unwrap().status(), StatusCode::OK);
    assert_eq!(db.payments().await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_over_the_limit_commits_a_tombstone_and_never_runs_again() {
    let db = Db::new(&shared_url().await, "tombstone").await;
    let (gate, _entered) = Gate::new();
    let server = serve(router(&db, db.layer(|b| b).await, gate)).await;
    let big = post(&server, "k", "big", "card").await;
    assert_eq!(big.status, StatusCode::CREATED);
    assert_eq!(big.body.len(), crate::app::MAX_STORED * 4);
    let retry = post(&server, "k", "big", "card").await;
    assert_eq!(retry.status, StatusCode::CONFLICT);
    assert!(
        retry.text().contains("response-not-stored"),
        "{}",
        retry.text()
    );
    assert_eq!((db.payments().await, db.records().await), (1, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_records_are_swept_and_their_keys_run_again() {
    let db = Db::new(&shared_url().await, "retention").await;
    let (gate, _entered) = Gate::new();
    let layer = db.layer(|b| b.retention(Duration::from_millis(1))).await;
    let server = serve(router(&db, layer.clone(), gate)).await;
    assert_eq!(
        post(&server, "a", "ok", "card").await.status,
        StatusCode::CREATED
    );
    assert_eq!(
        post(&server, "b", "ok", "card").await.status,
        StatusCode::CREATED
    );
    // The layer sweeps in the background; wait for its sweep or make one.
    let _ = layer.sweep().await.unwrap();
    assert_eq!(db.records().await, 0);
    let again = post(&server, "a", "ok", "card").await;
    assert_eq!(again.header("idempotent-replayed"), None);
    assert_eq!(db.payments().await, 3);
}

/// Retention counts from the commit, not from the claim: a handler that runs longer than
/// the retention (1 s; the handler waits 1.5 s for the gate) leaves a record that a retry
/// right after the answer (and the background sweep the commit starts) still finds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_slower_than_the_retention_is_replayed_right_after_its_answer() {
    let db = Db::new(&shared_url().await, "slow_retention").await;
    let (gate, mut entered) = Gate::new();
    let layer = db.layer(|b| b.retention(Duration::from_secs(1))).await;
    let server = std::sync::Arc::new(serve(router(&db, layer, gate.clone())).await);
    let first = tokio::spawn({
        let server = server.clone();
        async move { post(&server, "k", "hang", "card").await }
    });
    entered.recv().await.unwrap();
    // Not a synchronisation: the handler must outlast the retention.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    gate.release.notify_one();
    let first = first.await.unwrap();
    assert_eq!(first.status, StatusCode::CREATED);
    let retry = post(&server, "k", "ok", "card").await;
    assert_eq!(
        (retry.status, retry.header("idempotent-replayed")),
        (StatusCode::CREATED, Some("true")),
        "{}",
        retry.text()
    );
    assert_eq!(retry.body, first.body);
    assert_eq!((db.payments().await, db.records().await), (1, 1));
}

/// Begins and commits "a transaction" of its own on the lent connection, and one it rolls
/// back: sqlx knows the connection is in the layer's transaction, so these are savepoints.
async fn nests(
    axum::Extension(schema): axum::Extension<String>,
    mut tx: tower_lock_axum::Tx,
) -> StatusCode {
    for (note, keep) in [("kept", true), ("undone", false)] {
        let mut nested = sqlx::Connection::begin(&mut *tx).await.unwrap();
        sqlx::query(&format!(
            "INSERT INTO {schema}.payments (note) VALUES ('{note}')"
        ))
        .persistent(false)
        .execute(&mut *nested)
        .await
        .unwrap();
        if keep {
            nested.commit().await.unwrap();
        } else {
            nested.rollback().await.unwrap();
        }
    }
    StatusCode::CREATED
}

/// A handler's own `begin()` on the lent connection is a savepoint inside the request's
/// transaction: its commit does not end the layer's transaction, the record commits with
/// the rows it kept, and a retry is replayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handlers_nested_transaction_is_a_savepoint_in_the_requests() {
    let db = Db::new(&shared_url().await, "nested").await;
    let app = axum::Router::new()
        .route("/payments", axum::routing::post(nests))
        .layer(db.layer(|b| b).await)
        .layer(axum::Extension(db.schema.clone()));
    let server = serve(app).await;
    let first = post(&server, "k", "ok", "card").await;
    assert_eq!(first.status, StatusCode::CREATED, "{}", first.text());
    let again = post(&server, "k", "ok", "card").await;
    assert_eq!(again.status, StatusCode::CREATED);
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    let notes: Vec<String> = sqlx::raw_sql(&format!("SELECT note FROM {}.payments", db.schema))
        .fetch_all(&db.pool)
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(notes, ["kept"]);
}
