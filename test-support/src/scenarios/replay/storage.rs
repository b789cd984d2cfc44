//! Which answers are stored: only those that mean "it happened". Never a `5xx` (unless
//! asked), an answer that means "try again", or a response over the size limit; the
//! application decides the rest with a mark and a predicate.

use std::sync::atomic::Ordering;

use bytes::Bytes;
use http::StatusCode;

use super::{app::replay_app, post_with, preset, until_recorded};
use crate::scenarios::{Stack, idempotency_lock_key};

/// A `5xx` is not stored: the retry runs the handler again. With `store_server_errors`,
/// it is replayed.
pub async fn server_errors_are_not_stored_unless_asked(on: Stack) {
    let table = on.table("replay-5xx").await;
    let app = replay_app(on, preset(&table).build().unwrap()).await;
    for n in 1..=2 {
        let reply = post_with(&app.server, "/fail", "o5", "").await;
        assert_eq!(
            (reply.status, reply.text()),
            (StatusCode::INTERNAL_SERVER_ERROR, format!("boom {n}"))
        );
    }
    table
        .assert_only_records(&[idempotency_lock_key("o5")], 0)
        .await;
    let app = replay_app(
        on,
        preset(&table).store_server_errors(true).build().unwrap(),
    )
    .await;
    let first = post_with(&app.server, "/fail", "o5", "").await;
    until_recorded(&table, "o5").await;
    let again = post_with(&app.server, "/fail", "o5", "").await;
    assert_eq!((again.status, &again.body), (first.status, &first.body));
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!(app.runs.load(Ordering::SeqCst), 1);
}

/// An answer that means "this did not happen, try again" is never stored: `408`, `409`,
/// `423`, `425`, `429`, `5xx`, with or without `Retry-After`, and by default `400`, `401`,
/// `403`, `407`, `413`, `415`, `422`; nor is a framework extractor's rejection. The retry
/// runs the handler again. (A `2xx` with `Retry-After` is stored: see `status_policy`.)
pub async fn answers_that_mean_try_again_are_never_stored(on: Stack) {
    let table = on.table("replay-transient").await;
    let app = replay_app(on, preset(&table).build().unwrap()).await;
    let cases: [(&str, Option<&str>); 15] = [
        ("400", None),
        ("413", None),
        ("415", None),
        ("422", None),
        ("408", None),
        ("409", None),
        ("423", Some("30")),
        ("425", None),
        ("429", Some("5")),
        ("503", Some("1")),
        ("401", None),
        ("403", None),
        ("407", None),
        ("500", Some("3")),
        ("502", None),
    ];
    let mut runs = 0;
    for (status, retry_after) in cases {
        let k = format!("\"t-{status}\"");
        let mut headers = vec![("idempotency-key", k.as_str()), ("x-status", status)];
        if let Some(after) = retry_after {
            headers.push(("x-retry-after", after));
        }
        for _ in 0..2 {
            let reply = app
                .server
                .send_body("POST", "/answer", &headers, "same")
                .await;
            runs += 1;
            assert_eq!(reply.status.as_str(), status);
            assert_eq!(
                reply.header("idempotent-replayed"),
                None,
                "{status} (retry-after {retry_after:?}) was stored and replayed"
            );
            assert_eq!(reply.header("x-run"), Some(runs.to_string().as_str()));
        }
    }
    // The framework's own `String` extractor refuses a body that is not UTF-8 (`400`)
    // before the handler runs: not stored either.
    for _ in 0..2 {
        let reply = app
            .server
            .send_body(
                "POST",
                "/orders",
                &[("idempotency-key", "\"t-extractor\"")],
                Bytes::from_static(b"\xff\xfe"),
            )
            .await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST);
        assert_eq!(
            reply.header("idempotent-replayed"),
            None,
            "an extractor's 400"
        );
    }
    let mut keys: Vec<String> = cases
        .iter()
        .map(|(status, _)| idempotency_lock_key(&format!("t-{status}")))
        .collect();
    keys.push(idempotency_lock_key("t-extractor"));
    table.assert_only_records(&keys, 0).await;
}

/// A response over the stored-body limit is delivered in full, and a retry is answered
/// with the `response-not-stored` problem (with the original status), never a second run.
pub async fn an_oversized_response_is_not_replayed_nor_run_again(on: Stack) {
    let table = on.table("replay-big").await;
    let layer = preset(&table).max_response_body(1024).build().unwrap();
    let app = replay_app(on, layer).await;
    let first = post_with(&app.server, "/big", "o9", "").await;
    assert_eq!((first.status, first.body.len()), (StatusCode::OK, 4096));
    until_recorded(&table, "o9").await;
    let retry = post_with(&app.server, "/big", "o9", "").await;
    assert_eq!(retry.status, StatusCode::CONFLICT);
    let problem = retry.json();
    assert_eq!(
        problem["type"],
        "urn:tower-lock:problem:response-not-stored"
    );
    assert_eq!(problem["original_status"], 200);
    assert_eq!(retry.header("retry-after"), None);
    assert_eq!(app.runs.load(Ordering::SeqCst), 1);
    table
        .assert_only_records(&[idempotency_lock_key("o9")], 1)
        .await;
}

/// The application decides what else is stored: a response marked `NotStored` (by a
/// handler or an inner layer) is not, and a `store_if` predicate refuses the rest it
/// wants; `401` is not stored by default, but a predicate may store it.
pub async fn the_application_decides_what_else_is_stored(on: Stack) {
    let table = on.table("replay-store-if").await;
    let layer = preset(&table)
        // Store successes and 401s only (a 422 validation error runs again).
        .store_if(|status: StatusCode, _: &http::HeaderMap| {
            status.is_success() || status == StatusCode::UNAUTHORIZED
        })
        .build()
        .unwrap();
    let app = replay_app(on, layer).await;
    let twice = |k: &'static str, extra: &'static [(&'static str, &'static str)]| {
        let server = app.server.clone();
        async move {
            let key = format!("\"{k}\"");
            let mut headers = vec![("idempotency-key", key.as_str())];
            headers.extend_from_slice(extra);
            let first = server.send_body("POST", "/answer", &headers, "x").await;
            let second = server.send_body("POST", "/answer", &headers, "x").await;
            (first, second)
        }
    };
    let (_, marked) = twice("marked", &[("x-not-stored", "1")]).await;
    assert_eq!(
        marked.header("idempotent-replayed"),
        None,
        "marked NotStored"
    );
    let (_, invalid) = twice("invalid", &[("x-status", "422")]).await;
    assert_eq!(
        invalid.header("idempotent-replayed"),
        None,
        "refused by store_if"
    );
    let (_, stored) = twice("ok", &[]).await;
    assert_eq!(stored.header("idempotent-replayed"), Some("true"));
    let (_, unauthorized) = twice("401", &[("x-status", "401")]).await;
    assert_eq!(unauthorized.header("idempotent-replayed"), Some("true"));
    assert_eq!(app.runs.load(Ordering::SeqCst), 6);
    let keys: Vec<String> = ["marked", "invalid", "ok", "401"]
        .iter()
        .map(|k| idempotency_lock_key(k))
        .collect();
    table.assert_only_records(&keys, 2).await;
}
