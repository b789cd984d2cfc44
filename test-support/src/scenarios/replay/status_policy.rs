//! The status decides whether an answer means "it did not happen": a `Retry-After` counts
//! only on the statuses that say "try again", so an accepted job (`202` with `Retry-After`)
//! is stored and its retry never queues a second job, and `store_if` is asked about every
//! answer the fixed policy does not forbid.

use std::sync::{Arc, Mutex, atomic::Ordering};

use http::StatusCode;

use super::{app::replay_app, preset, until_recorded};
use crate::{
    http::{Reply, TestServer},
    scenarios::Stack,
};

/// `POST /answer` with idempotency key `k`, asking for `status` and, when given, a
/// `Retry-After` and a `Location`.
async fn answer(
    server: &TestServer,
    k: &str,
    status: &str,
    retry_after: Option<&str>,
    location: Option<&str>,
) -> Reply {
    let key = format!("\"{k}\"");
    let mut headers = vec![("idempotency-key", key.as_str()), ("x-status", status)];
    if let Some(after) = retry_after {
        headers.push(("x-retry-after", after));
    }
    if let Some(location) = location {
        headers.push(("x-location", location));
    }
    server.send_body("POST", "/answer", &headers, "job").await
}

/// The asynchronous-job answer (`202 Accepted`, `Location`, `Retry-After`) is stored: the
/// client's retry gets it replayed, with its `Location` and `Retry-After`, and no second job
/// is queued. So is a `200` with `Retry-After`. A `Retry-After` still keeps a `5xx` out of
/// the records when server errors are stored, and a `503` is never stored, with or without
/// one.
pub async fn an_accepted_job_with_retry_after_is_stored(on: Stack) {
    let table = on.table("replay-accepted").await;
    let app = replay_app(on, preset(&table).build().unwrap()).await;
    for (k, status) in [("job-202", "202"), ("job-200", "200")] {
        let first = answer(&app.server, k, status, Some("5"), Some("/exports/1")).await;
        assert_eq!(first.status.as_str(), status);
        until_recorded(&table, k).await;
        let retry = answer(&app.server, k, status, Some("5"), Some("/exports/1")).await;
        assert_eq!(
            (
                retry.status.as_str(),
                retry.header("idempotent-replayed"),
                retry.header("x-run"),
                retry.header("location"),
                retry.header("retry-after"),
            ),
            (
                status,
                Some("true"),
                first.header("x-run"),
                Some("/exports/1"),
                Some("5"),
            ),
            "the retry of a {status} with Retry-After ran again: {:?}",
            retry.text()
        );
    }
    assert_eq!(app.runs.load(Ordering::SeqCst), 2, "one job each");

    let app = replay_app(
        on,
        preset(&table).store_server_errors(true).build().unwrap(),
    )
    .await;
    for (k, status, retry_after) in [
        ("e-500-after", "500", Some("1")),
        ("e-503", "503", None),
        ("e-503-after", "503", Some("1")),
    ] {
        for _ in 0..2 {
            let reply = answer(&app.server, k, status, retry_after, None).await;
            assert_eq!(reply.status.as_str(), status);
            assert_eq!(
                reply.header("idempotent-replayed"),
                None,
                "{status} (retry-after {retry_after:?}) was stored"
            );
        }
    }
    let stored = answer(&app.server, "e-500", "500", None, None).await;
    until_recorded(&table, "e-500").await;
    let replayed = answer(&app.server, "e-500", "500", None, None).await;
    assert_eq!(replayed.header("idempotent-replayed"), Some("true"));
    assert_eq!(replayed.header("x-run"), stored.header("x-run"));
}

/// `store_if` is asked about every answer the fixed policy does not forbid, a `2xx` with
/// `Retry-After` among them (and may refuse it), and never about one it forbids (`429`,
/// `503`, a `5xx` with `Retry-After`).
pub async fn store_if_is_asked_about_everything_the_fixed_policy_allows(on: Stack) {
    let table = on.table("replay-asked").await;
    let asked: Arc<Mutex<Vec<(u16, bool)>>> = Arc::default();
    let layer = {
        let asked = asked.clone();
        preset(&table)
            .store_server_errors(true)
            .store_if(move |status: StatusCode, headers: &http::HeaderMap| {
                let retry_after = headers.contains_key(http::header::RETRY_AFTER);
                asked.lock().unwrap().push((status.as_u16(), retry_after));
                // An application that polls its jobs some other way: no 202 is stored.
                status != StatusCode::ACCEPTED
            })
            .build()
            .unwrap()
    };
    let app = replay_app(on, layer).await;
    for (k, status, retry_after) in [
        ("a-202", "202", Some("5")),
        ("a-201", "201", Some("5")),
        ("a-400", "400", Some("5")),
        ("a-429", "429", Some("5")),
        ("a-503", "503", None),
        ("a-500", "500", Some("5")),
    ] {
        answer(&app.server, k, status, retry_after, None).await;
    }
    assert_eq!(
        *asked.lock().unwrap(),
        [(202, true), (201, true), (400, true)],
        "what store_if was asked about"
    );
    let retry = answer(&app.server, "a-202", "202", Some("5"), None).await;
    assert_eq!(
        retry.header("idempotent-replayed"),
        None,
        "store_if refused it"
    );
    until_recorded(&table, "a-201").await;
    let retry = answer(&app.server, "a-201", "201", Some("5"), None).await;
    assert_eq!(retry.header("idempotent-replayed"), Some("true"));
}
