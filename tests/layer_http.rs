//! The layer through a real server socket (axum on 127.0.0.1:0, hyper-util client), on
//! the in-process engine (and an unavailable backend for the failure policies).

mod support;

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use axum::{
    Router,
    body::Body,
    extract::{Extension, Request},
    http::{HeaderName, StatusCode},
    response::Response,
    routing::post,
};
use bytes::Bytes;
use http_body_util::BodyExt;
use support::http::{Gate, GateControl, Reply, UnavailableBackend, channel_body, gate, serve};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    sync::{mpsc, oneshot},
    task::JoinHandle,
};
use tower_lock::{
    BackendFailurePolicy, LeaseInfo, LockEngine, LockLayer, MissingKeyPolicy,
    key::{GlobalKey, HeaderKey, IdempotencyKey, ScopedKey},
};

fn header_key() -> HeaderKey {
    HeaderKey::new(HeaderName::from_static("x-key"))
}

/// The lock key of a request with `x-key: <value>` to a layer keyed on [`header_key`]
/// without a namespace.
fn lock_key(value: &str) -> String {
    tower_lock::key::encode(
        "",
        tower_lock::key::KeyExtractor::kind(&header_key()),
        value,
    )
}

/// A handler on `/work` that waits at the gate and answers with its lease's fence (or
/// "unlocked").
fn gated_app(layer: LockLayer, gate: Gate) -> Router {
    gated_route("/work", layer, gate)
}

/// A handler on `path` that reports its `x-seq` header at the gate, waits there, and
/// answers with its lease's fence (or "unlocked").
fn gated_route(path: &str, layer: LockLayer, gate: Gate) -> Router {
    Router::new()
        .route(
            path,
            post(move |req: Request| {
                let gate = gate.clone();
                async move {
                    let who = req
                        .headers()
                        .get("x-seq")
                        .map_or(String::new(), |v| v.to_str().unwrap().to_owned());
                    let info = req.extensions().get::<LeaseInfo>().cloned();
                    gate.pass(who).await;
                    match info {
                        Some(info) if info.is_degraded() => format!("degraded:{}", info.fence()),
                        Some(info) => format!("fence:{}", info.fence()),
                        None => "unlocked".to_owned(),
                    }
                }
            }),
        )
        .route_layer(layer)
}

async fn wait_for_waiters(engine: &LockEngine, key: &str, n: usize) {
    tokio::time::timeout(Duration::from_secs(10), async {
        // The engine offers no event for "a waiter queued"; look again after each yield.
        while engine.lock(key).waiters().await.unwrap() < n {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await
    .expect("waiters queue within 10 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifo_requests_with_one_key_never_overlap_and_run_in_arrival_order() {
    const N: usize = 8;
    let engine = LockEngine::in_memory();
    let layer = LockLayer::builder(engine.clone())
        .key(header_key())
        .wait(Duration::from_secs(30))
        .fifo(true)
        .build()
        .unwrap();
    let in_handler = Arc::new(AtomicUsize::new(0));
    let max_in_handler = Arc::new(AtomicUsize::new(0));
    let order = Arc::new(Mutex::new(Vec::new()));
    let (gate, mut control) = gate();
    let app = {
        let (in_handler, max_in_handler, order) =
            (in_handler.clone(), max_in_handler.clone(), order.clone());
        Router::new()
            .route(
                "/work",
                post(move |Extension(info): Extension<LeaseInfo>, req: Request| {
                    let (in_handler, max_in_handler, order, gate) = (
                        in_handler.clone(),
                        max_in_handler.clone(),
                        order.clone(),
                        gate.clone(),
                    );
                    async move {
                        let now = in_handler.fetch_add(1, Ordering::SeqCst) + 1;
                        max_in_handler.fetch_max(now, Ordering::SeqCst);
                        let seq: usize = req.headers()["x-seq"].to_str().unwrap().parse().unwrap();
                        gate.pass(seq.to_string()).await;
                        // Give a concurrent handler every chance to overlap this one.
                        for _ in 0..10 {
                            tokio::task::yield_now().await;
                        }
                        order.lock().unwrap().push((seq, info.fence()));
                        in_handler.fetch_sub(1, Ordering::SeqCst);
                        "done"
                    }
                }),
            )
            .route_layer(layer)
    };
    let server = Arc::new(serve(app).await);

    let mut tasks = Vec::new();
    for seq in 0..N {
        let server = server.clone();
        tasks.push(tokio::spawn(async move {
            server
                .post("/work", &[("x-key", "k"), ("x-seq", &seq.to_string())])
                .await
        }));
        if seq == 0 {
            assert_eq!(control.arrived().await, "0");
        } else {
            // Arrival order is the order in the engine's queue.
            wait_for_waiters(&engine, &lock_key("k"), seq).await;
        }
    }
    control.open();
    for task in tasks {
        let reply = task.await.unwrap();
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    }
    let order = order.lock().unwrap().clone();
    let seqs: Vec<usize> = order.iter().map(|(s, _)| *s).collect();
    assert_eq!(seqs, (0..N).collect::<Vec<_>>());
    assert!(
        order.windows(2).all(|w| w[0].1 < w[1].1),
        "fences increase: {order:?}"
    );
    assert_eq!(max_in_handler.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn held_key_is_answered_423_with_retry_after_and_problem_json() {
    let engine = LockEngine::in_memory();
    let layer = LockLayer::builder(engine.clone())
        .key(header_key())
        .ttl(Duration::from_millis(2_500))
        .build()
        .unwrap();
    let (gate, mut control) = gate();
    let server = Arc::new(serve(gated_app(layer, gate)).await);

    let first = tokio::spawn({
        let server = server.clone();
        async move { server.post("/work", &[("x-key", "k")]).await }
    });
    control.arrived().await;
    let second = server.post("/work", &[("x-key", "k")]).await;
    assert_eq!(second.status, StatusCode::LOCKED);
    let retry: u64 = second.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=3).contains(&retry), "retry-after {retry}");
    assert_eq!(
        second.header("content-type"),
        Some("application/problem+json")
    );
    let problem = second.json();
    assert_eq!(problem["type"], "urn:tower-lock:problem:locked");
    assert_eq!(problem["status"], 423);
    assert_eq!(problem["retry_after"], retry);
    assert!(problem["title"].is_string() && problem["detail"].is_string());

    // Another key is not affected.
    let other = tokio::spawn({
        let server = server.clone();
        async move { server.post("/work", &[("x-key", "other")]).await }
    });
    control.arrived().await;
    control.open();
    assert_eq!(first.await.unwrap().status, StatusCode::OK);
    assert_eq!(other.await.unwrap().status, StatusCode::OK);
}

#[tokio::test]
async fn wait_that_runs_out_is_answered_429_with_retry_after() {
    let engine = LockEngine::in_memory();
    let layer = LockLayer::builder(engine.clone())
        .key(header_key())
        .wait(Duration::from_millis(100))
        .build()
        .unwrap();
    let (gate, mut control) = gate();
    let server = Arc::new(serve(gated_app(layer, gate)).await);
    let first = tokio::spawn({
        let server = server.clone();
        async move { server.post("/work", &[("x-key", "k")]).await }
    });
    control.arrived().await;
    let second = server.post("/work", &[("x-key", "k")]).await;
    assert_eq!(second.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(
        second
            .header("retry-after")
            .unwrap()
            .parse::<u64>()
            .unwrap()
            >= 1
    );
    assert_eq!(
        second.json()["type"],
        "urn:tower-lock:problem:wait-timed-out"
    );
    control.open();
    assert_eq!(first.await.unwrap().status, StatusCode::OK);
}

#[tokio::test]
async fn full_wait_queue_is_answered_429_at_once() {
    let engine = LockEngine::in_memory();
    let layer = LockLayer::builder(engine.clone())
        .key(header_key())
        .wait(Duration::from_secs(30))
        .max_waiters(1)
        .build()
        .unwrap();
    let (gate, mut control) = gate();
    let server = Arc::new(serve(gated_app(layer, gate)).await);
    let first = tokio::spawn({
        let server = server.clone();
        async move { server.post("/work", &[("x-key", "k")]).await }
    });
    control.arrived().await;
    let waiting = tokio::spawn({
        let server = server.clone();
        async move { server.post("/work", &[("x-key", "k")]).await }
    });
    wait_for_waiters(&engine, &lock_key("k"), 1).await;
    let third = server.post("/work", &[("x-key", "k")]).await;
    assert_eq!(third.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        third.json()["type"],
        "urn:tower-lock:problem:too-many-waiters"
    );
    assert!(third.header("retry-after").is_some());
    control.open();
    assert_eq!(first.await.unwrap().status, StatusCode::OK);
    assert_eq!(waiting.await.unwrap().status, StatusCode::OK);
}

#[tokio::test]
async fn missing_key_is_400_or_passes_through_as_configured() {
    let (gate, control) = gate();
    control.open();
    let reject = serve(gated_app(
        LockLayer::builder(LockEngine::in_memory())
            .key(header_key())
            .build()
            .unwrap(),
        gate.clone(),
    ))
    .await;
    let reply = reject.post("/work", &[]).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(reply.json()["type"], "urn:tower-lock:problem:missing-key");
    assert!(reply.header("retry-after").is_none());

    let pass = serve(gated_app(
        LockLayer::builder(LockEngine::in_memory())
            .key(header_key())
            .on_missing_key(MissingKeyPolicy::PassThrough)
            .build()
            .unwrap(),
        gate,
    ))
    .await;
    let reply = pass.post("/work", &[]).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.text(), "unlocked");
    assert!(
        pass.post("/work", &[("x-key", "k")])
            .await
            .text()
            .starts_with("fence:")
    );
}

#[tokio::test]
async fn idempotency_preset_requires_a_wellformed_key_and_answers_duplicates_409() {
    let layer = LockLayer::idempotency(LockEngine::in_memory())
        .key(ScopedKey::new(
            HeaderName::from_static("x-tenant"),
            IdempotencyKey::new(),
        ))
        .build()
        .unwrap();
    let (gate, mut control) = gate();
    let server = Arc::new(serve(gated_app(layer, gate)).await);

    let missing = server.post("/work", &[("x-tenant", "a")]).await;
    assert_eq!(missing.status, StatusCode::BAD_REQUEST);
    assert_eq!(missing.json()["type"], "urn:tower-lock:problem:missing-key");
    let long = "k".repeat(256);
    for bad in ["\"unterminated", "a\"b", long.as_str()] {
        let reply = server
            .post("/work", &[("x-tenant", "a"), ("idempotency-key", bad)])
            .await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{bad}");
        assert_eq!(reply.json()["type"], "urn:tower-lock:problem:malformed-key");
    }

    let first = tokio::spawn({
        let server = server.clone();
        async move {
            server
                .post(
                    "/work",
                    &[("x-tenant", "a"), ("idempotency-key", "\"abc\"")],
                )
                .await
        }
    });
    control.arrived().await;
    // The bare form is the same key.
    let dup = server
        .post("/work", &[("x-tenant", "a"), ("idempotency-key", "abc")])
        .await;
    assert_eq!(dup.status, StatusCode::CONFLICT);
    assert_eq!(dup.json()["type"], "urn:tower-lock:problem:conflict");
    assert!(dup.header("retry-after").unwrap().parse::<u64>().unwrap() >= 1);

    // Another tenant's identical key is another lock.
    let other_tenant = tokio::spawn({
        let server = server.clone();
        async move {
            server
                .post("/work", &[("x-tenant", "b"), ("idempotency-key", "abc")])
                .await
        }
    });
    control.arrived().await;
    control.open();
    assert_eq!(first.await.unwrap().status, StatusCode::OK);
    assert_eq!(other_tenant.await.unwrap().status, StatusCode::OK);
}

#[tokio::test]
async fn unavailable_backend_fails_closed_with_503_and_retry_after() {
    let layer = LockLayer::builder(LockEngine::new(UnavailableBackend))
        .key(header_key())
        .retry_after_fallback(Duration::from_millis(4_200))
        .build()
        .unwrap();
    let (gate, control) = gate();
    control.open();
    let server = serve(gated_app(layer, gate)).await;
    let reply = server.post("/work", &[("x-key", "k")]).await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(reply.header("retry-after"), Some("5"));
    assert_eq!(
        reply.json()["type"],
        "urn:tower-lock:problem:lock-unavailable"
    );
}

#[tokio::test]
async fn unavailable_backend_fails_open_when_configured() {
    let layer = LockLayer::builder(LockEngine::new(UnavailableBackend))
        .key(header_key())
        .on_backend_failure(BackendFailurePolicy::FailOpen)
        .build()
        .unwrap();
    let (gate, mut control) = gate();
    let server = Arc::new(serve(gated_app(layer.clone(), gate)).await);
    // Unlocked: two requests with one key run at the same time.
    let a = tokio::spawn({
        let server = server.clone();
        async move { server.post("/work", &[("x-key", "k")]).await }
    });
    control.arrived().await;
    let b = tokio::spawn({
        let server = server.clone();
        async move { server.post("/work", &[("x-key", "k")]).await }
    });
    control.arrived().await;
    control.open();
    assert_eq!(a.await.unwrap().text(), "unlocked");
    assert_eq!(b.await.unwrap().text(), "unlocked");
    assert_eq!(layer.metrics().snapshot().unlocked, 2);
}

#[tokio::test]
async fn unavailable_backend_degrades_to_an_in_process_lock_when_configured() {
    let layer = LockLayer::builder(LockEngine::new(UnavailableBackend))
        .key(header_key())
        .on_backend_failure(BackendFailurePolicy::Degrade)
        .build()
        .unwrap();
    let (gate, mut control) = gate();
    let server = Arc::new(serve(gated_app(layer.clone(), gate)).await);
    let a = tokio::spawn({
        let server = server.clone();
        async move { server.post("/work", &[("x-key", "k")]).await }
    });
    control.arrived().await;
    let b = server.post("/work", &[("x-key", "k")]).await;
    assert_eq!(b.status, StatusCode::LOCKED);
    control.open();
    assert!(a.await.unwrap().text().starts_with("degraded:"));
    assert_eq!(layer.metrics().snapshot().degraded, 1);
}

#[tokio::test]
async fn streaming_body_keeps_the_key_locked_until_its_last_chunk() {
    let engine = LockEngine::in_memory();
    let layer = LockLayer::builder(engine.clone())
        .key(header_key())
        .build()
        .unwrap();
    let (senders_tx, mut senders_rx) = mpsc::unbounded_channel();
    let app = Router::new()
        .route(
            "/stream",
            post(move || {
                let senders_tx = senders_tx.clone();
                async move {
                    let (tx, body) = channel_body();
                    senders_tx.send(tx).unwrap();
                    Response::new(Body::new(body))
                }
            }),
        )
        .route_layer(layer);
    let server = serve(app).await;
    let res = server
        .send_streaming(server.request("POST", "/stream").header("x-key", "k"))
        .await;
    assert_eq!(res.status(), StatusCode::OK);
    let tx = senders_rx.recv().await.unwrap();
    let mut body = res.into_body();

    tx.send(Bytes::from_static(b"first")).await.unwrap();
    let frame = body.frame().await.unwrap().unwrap();
    assert_eq!(frame.into_data().unwrap(), "first");
    // The handler has returned, the body is still streaming: the key is held.
    assert!(engine.lock(lock_key("k")).try_acquire().await.is_err());
    let again = server.post("/stream", &[("x-key", "k")]).await;
    assert_eq!(again.status, StatusCode::LOCKED);

    tx.send(Bytes::from_static(b"last")).await.unwrap();
    drop(tx);
    let rest = body.collect().await.unwrap().to_bytes();
    assert_eq!(rest, "last");
    // Released once the body ended (in the background): a waiter gets it.
    let lease = engine
        .lock(lock_key("k"))
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .expect("the key is released after the last chunk");
    drop(lease);
}

#[tokio::test]
async fn disconnecting_client_frees_the_key() {
    let engine = LockEngine::in_memory();
    let layer = LockLayer::builder(engine.clone())
        .key(header_key())
        .ttl(Duration::from_secs(60))
        .build()
        .unwrap();
    let (entered_tx, mut entered_rx) = mpsc::unbounded_channel();
    let (dropped_tx, dropped_rx) = oneshot::channel::<()>();
    let dropped_tx = Arc::new(Mutex::new(Some(dropped_tx)));
    struct OnDrop(Arc<Mutex<Option<oneshot::Sender<()>>>>);
    impl Drop for OnDrop {
        fn drop(&mut self) {
            if let Some(tx) = self.0.lock().unwrap().take() {
                let _ = tx.send(());
            }
        }
    }
    let app = Router::new()
        .route(
            "/hang",
            post(move || {
                let (entered_tx, dropped_tx) = (entered_tx.clone(), dropped_tx.clone());
                async move {
                    let _guard = OnDrop(dropped_tx);
                    entered_tx.send(()).unwrap();
                    std::future::pending::<()>().await;
                    "never"
                }
            }),
        )
        .route_layer(layer);
    let server = serve(app).await;

    let mut stream = tokio::net::TcpStream::connect(server.addr()).await.unwrap();
    stream
        .write_all(b"POST /hang HTTP/1.1\r\nhost: test\r\nx-key: k\r\ncontent-length: 0\r\n\r\n")
        .await
        .unwrap();
    entered_rx.recv().await.unwrap();
    assert!(engine.lock(lock_key("k")).try_acquire().await.is_err());
    drop(stream);

    tokio::time::timeout(Duration::from_secs(10), dropped_rx)
        .await
        .expect("the server drops the handler when the client goes away")
        .unwrap();
    // The TTL is a minute: getting the key within seconds means it was released.
    engine
        .lock(lock_key("k"))
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .expect("the key is released when the client disconnects");
}

#[tokio::test]
async fn one_layer_on_many_routes_shares_one_lock_table() {
    let layer = LockLayer::builder(LockEngine::in_memory())
        .key(GlobalKey::new("maintenance"))
        .build()
        .unwrap();
    let (gate, mut control) = gate();
    let handler = move || {
        let gate = gate.clone();
        async move {
            gate.pass(String::new()).await;
            "ok"
        }
    };
    let app = Router::new()
        .route("/a", post(handler.clone()))
        .route("/b", post(handler))
        .route_layer(layer.clone());
    let server = Arc::new(serve(app).await);
    let a = tokio::spawn({
        let server = server.clone();
        async move { server.post("/a", &[]).await }
    });
    control.arrived().await;
    let b = server.post("/b", &[]).await;
    assert_eq!(b.status, StatusCode::LOCKED);
    control.open();
    assert_eq!(a.await.unwrap().status, StatusCode::OK);
    let snap = layer.metrics().snapshot();
    assert_eq!((snap.acquired, snap.rejected.locked), (1, 1));
}

#[tokio::test]
async fn rejection_hook_replaces_the_default_body_and_keeps_the_headers() {
    let layer = LockLayer::builder(LockEngine::in_memory())
        .key(header_key())
        .on_reject(|rejection| {
            let mut res = http::Response::new(Bytes::from(format!("custom {}", rejection.kind())));
            *res.status_mut() = rejection.status();
            for (name, value) in rejection.headers() {
                if name != "content-type" {
                    res.headers_mut().insert(name, value.parse().unwrap());
                }
            }
            res
        })
        .build()
        .unwrap();
    let (gate, control) = gate();
    control.open();
    let server = serve(gated_app(layer, gate)).await;
    let reply = server.post("/work", &[]).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(reply.text(), "custom missing_key");
}

#[tokio::test]
async fn raw_socket_sees_status_line_for_locked() {
    // A plain HTTP/1.1 client sees the 423 status line and the Retry-After header.
    let layer = LockLayer::builder(LockEngine::in_memory())
        .key(header_key())
        .build()
        .unwrap();
    let (gate, mut control) = gate();
    let server = Arc::new(serve(gated_app(layer, gate)).await);
    let first = tokio::spawn({
        let server = server.clone();
        async move { server.post("/work", &[("x-key", "k")]).await }
    });
    control.arrived().await;
    let mut stream = tokio::net::TcpStream::connect(server.addr()).await.unwrap();
    stream
        .write_all(b"POST /work HTTP/1.1\r\nhost: t\r\nx-key: k\r\nconnection: close\r\ncontent-length: 0\r\n\r\n")
        .await
        .unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await.unwrap();
    assert!(raw.starts_with("HTTP/1.1 423 Locked\r\n"), "{raw}");
    assert!(
        raw.to_ascii_lowercase().contains("\r\nretry-after: "),
        "{raw}"
    );
    control.open();
    assert_eq!(first.await.unwrap().status, StatusCode::OK);
}

#[tokio::test]
async fn client_leaving_in_the_middle_of_a_streamed_body_frees_the_key() {
    let engine = LockEngine::in_memory();
    let layer = LockLayer::builder(engine.clone())
        .key(header_key())
        .ttl(Duration::from_secs(60))
        .build()
        .unwrap();
    let (senders_tx, mut senders_rx) = mpsc::unbounded_channel();
    let app = Router::new()
        .route(
            "/stream",
            post(move || {
                let senders_tx = senders_tx.clone();
                async move {
                    let (tx, body) = channel_body();
                    tx.send(Bytes::from_static(b"first\n")).await.unwrap();
                    senders_tx.send(tx).unwrap();
                    Response::new(Body::new(body))
                }
            }),
        )
        .route_layer(layer);
    let server = serve(app).await;
    let mut stream = tokio::net::TcpStream::connect(server.addr()).await.unwrap();
    stream
        .write_all(b"POST /stream HTTP/1.1\r\nhost: t\r\nx-key: k\r\ncontent-length: 0\r\n\r\n")
        .await
        .unwrap();
    let mut head = vec![0u8; 512];
    let mut got = 0;
    while !String::from_utf8_lossy(&head[..got]).contains("first") {
        got += stream.read(&mut head[got..]).await.unwrap();
    }
    let tx = senders_rx.recv().await.unwrap();
    assert!(engine.lock(lock_key("k")).try_acquire().await.is_err());
    drop(stream);
    // The server notices the closed connection and drops the body (and its lease); the
    // sender then sees its receiver gone.
    tokio::time::timeout(Duration::from_secs(10), tx.closed())
        .await
        .expect("the server drops the body when the client goes away");
    engine
        .lock(lock_key("k"))
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .expect("the key is released when the client leaves mid-body");
}

/// The lease is released before the response completes: a client that has read a whole
/// response and at once sends the next request for the same key is never turned away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn back_to_back_requests_for_one_key_never_see_423() {
    let engine = LockEngine::in_memory();
    let layer = LockLayer::builder(engine.clone())
        .key(header_key())
        .build()
        .unwrap();
    let app = Router::new()
        .route("/write", post(|| async { "written" }))
        .route(
            "/stream",
            post(|| async {
                // A body that ends after three chunks sent by another task.
                let (tx, body) = channel_body();
                tokio::spawn(async move {
                    for chunk in ["a", "b", "c"] {
                        tx.send(Bytes::from_static(chunk.as_bytes())).await.unwrap();
                    }
                });
                Response::new(Body::new(body))
            }),
        )
        .route_layer(layer);
    let server = serve(app).await;
    for round in 0..200 {
        let path = if round % 2 == 0 { "/write" } else { "/stream" };
        let reply = server.post(path, &[("x-key", "k")]).await;
        assert_eq!(
            reply.status,
            StatusCode::OK,
            "round {round}: {}",
            reply.text()
        );
    }
    assert!(!engine.lock(lock_key("k")).locked().await.unwrap());
}

/// Wait until the handler of `request` reports `who` at the gate; fail at once if the
/// request is answered instead (refused by its layer).
async fn reaches_its_handler(
    control: &mut GateControl,
    request: &mut JoinHandle<Reply>,
    who: &str,
) {
    tokio::select! {
        arrived = control.arrived() => assert_eq!(arrived, who),
        reply = request => {
            let reply = reply.unwrap();
            panic!(
                "request {who} was answered {} instead of reaching its handler: {}",
                reply.status,
                reply.text()
            );
        }
    }
}

/// Keys are data, never syntax: `a` + `bX` and `ab` + `X` are two locks, not one.
#[tokio::test]
async fn a_client_of_one_namespace_cannot_spell_a_key_of_another() {
    let engine = LockEngine::in_memory();
    let layer = |namespace: &str| {
        LockLayer::builder(engine.clone())
            .key(header_key())
            .namespace(namespace)
            .build()
            .unwrap()
    };
    let (gate, mut control) = gate();
    let app =
        gated_route("/a", layer("a"), gate.clone()).merge(gated_route("/ab", layer("ab"), gate));
    let server = Arc::new(serve(app).await);

    let mut first = tokio::spawn({
        let server = server.clone();
        async move {
            server
                .post("/a", &[("x-key", "bX"), ("x-seq", "first")])
                .await
        }
    });
    reaches_its_handler(&mut control, &mut first, "first").await;
    let mut second = tokio::spawn({
        let server = server.clone();
        async move {
            server
                .post("/ab", &[("x-key", "X"), ("x-seq", "second")])
                .await
        }
    });
    reaches_its_handler(&mut control, &mut second, "second").await;
    control.open();
    assert_eq!(first.await.unwrap().status, StatusCode::OK);
    assert_eq!(second.await.unwrap().status, StatusCode::OK);
}

/// A layer keyed on a plain header cannot take the idempotency preset's lock by sending
/// the preset's key words.
#[tokio::test]
async fn a_plain_header_key_cannot_block_the_idempotency_preset() {
    let engine = LockEngine::in_memory();
    let plain = LockLayer::builder(engine.clone())
        .key(header_key())
        .build()
        .unwrap();
    let idempotent = LockLayer::idempotency(engine).build().unwrap();
    let (gate, mut control) = gate();
    let app =
        gated_route("/plain", plain, gate.clone()).merge(gated_route("/orders", idempotent, gate));
    let server = Arc::new(serve(app).await);

    let mut squatter = tokio::spawn({
        let server = server.clone();
        async move {
            server
                .post(
                    "/plain",
                    &[("x-key", "idempotency-key:k"), ("x-seq", "plain")],
                )
                .await
        }
    });
    reaches_its_handler(&mut control, &mut squatter, "plain").await;
    let mut order = tokio::spawn({
        let server = server.clone();
        async move {
            server
                .post(
                    "/orders",
                    &[("idempotency-key", "\"k\""), ("x-seq", "order")],
                )
                .await
        }
    });
    reaches_its_handler(&mut control, &mut order, "order").await;
    control.open();
    assert_eq!(squatter.await.unwrap().status, StatusCode::OK);
    assert_eq!(order.await.unwrap().status, StatusCode::OK);
}
