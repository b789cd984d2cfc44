//! A compression layer inside the idempotency layer encodes the stored response for the
//! first request's `Accept-Encoding`; a retry that does not accept that encoding must
//! never be sent it: it is refused (`409 response-not-stored`), and the handler does not
//! run again. A retry that accepts it is replayed as before.

use std::sync::{
    Arc,
    atomic::{AtomicUsize, Ordering},
};

use axum::{Router, extract::Request, middleware::Next, response::Response, routing::post};
use http::{HeaderValue, StatusCode, header};
use tower_lock::{IdempotencyLayer, LockEngine};
use tower_lock_test_support::http::serve;

/// Stands in for a compression layer: encodes (here: marks) the body as `gzip` when the
/// request accepts it.
async fn fake_gzip(req: Request, next: Next) -> Response {
    let gzip = req
        .headers()
        .get(header::ACCEPT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("gzip"));
    let mut res = next.run(req).await;
    if gzip {
        res.headers_mut()
            .insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
    }
    res
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_encoding_is_never_replayed_to_a_retry_that_does_not_accept_it() {
    let runs = Arc::new(AtomicUsize::new(0));
    let handler = {
        let runs = runs.clone();
        move || async move {
            runs.fetch_add(1, Ordering::SeqCst);
            (StatusCode::CREATED, "charged")
        }
    };
    let idempotency = IdempotencyLayer::builder(LockEngine::in_memory())
        .unscoped()
        .build()
        .unwrap();
    // Compression inside the idempotency layer: the layer order the README warns against.
    let app = Router::new()
        .route("/charges", post(handler))
        .route_layer(axum::middleware::from_fn(fake_gzip))
        .route_layer(idempotency);
    let server = serve(app).await;
    let key = ("idempotency-key", "\"k-1\"");

    let first = server
        .post("/charges", &[key, ("accept-encoding", "gzip")])
        .await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(first.header("content-encoding"), Some("gzip"));

    // The same client retries: replayed, gzip and all.
    let same = server
        .post("/charges", &[key, ("accept-encoding", "gzip, br")])
        .await;
    assert_eq!(same.status, StatusCode::CREATED);
    assert_eq!(same.header("idempotent-replayed"), Some("true"));

    // A retry that never asked for gzip is not sent gzip.
    for accept in [None, Some("br"), Some("gzip;q=0")] {
        let mut headers = vec![key];
        headers.extend(accept.map(|a| ("accept-encoding", a)));
        let retry = server.post("/charges", &headers).await;
        assert_eq!(
            retry.status,
            StatusCode::CONFLICT,
            "{accept:?}: {}",
            retry.text()
        );
        assert_eq!(retry.header("content-encoding"), None, "{accept:?}");
        let problem = retry.json();
        assert_eq!(
            problem["type"],
            "urn:tower-lock:problem:response-not-stored"
        );
        assert!(
            problem["detail"].as_str().unwrap().contains("gzip"),
            "{problem}"
        );
    }
    // Never run twice.
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}
