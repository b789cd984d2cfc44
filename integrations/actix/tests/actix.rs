//! The actix middleware through a real socket: actix `HttpServer` on 127.0.0.1:0 with
//! several workers, driven by a hyper-util client (a client that is not actix's own, and
//! the one the tower layer's tests use).

mod support;

use std::{
    collections::HashSet,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use actix_web::{App, HttpResponse, HttpServer, web};
use bytes::Bytes;
use http::StatusCode;
use http_body_util::BodyExt;
use support::{Reply, TestServer, channel_body, serve_axum, spawn_actix};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    sync::mpsc,
};
use tower_lock::{
    LockEngine, LockLayer, LockLayerBuilder, ReleasePoint, integration::RequestLocker,
    key::HeaderKey,
};
use tower_lock_actix::{LockFence, LockMiddleware, Locked};

const WORKERS: usize = 4;

fn header_key() -> HeaderKey {
    HeaderKey::new(http::HeaderName::from_static("x-key"))
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

/// An actix server with `WORKERS` workers whose `/work` resource answers "ok" under
/// `locker`.
fn actix_ok(locker: RequestLocker) -> TestServer {
    let lock = LockMiddleware::new(locker);
    let server = HttpServer::new(move || {
        App::new().service(
            web::resource("/work")
                .wrap(lock.clone())
                .route(web::post().to(|| async { "ok" })),
        )
    })
    .workers(WORKERS)
    .disable_signals()
    .bind(("127.0.0.1", 0))
    .unwrap();
    let addr = server.addrs()[0];
    spawn_actix(server.run(), addr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_with_one_key_never_overlap_across_workers() {
    const N: usize = 16;
    // Built once, outside the app factory: every worker locks on this one table.
    let lock = LockMiddleware::new(
        LockLayer::builder(LockEngine::in_memory())
            .key(header_key())
            .wait(Duration::from_secs(30))
            .build_locker()
            .unwrap(),
    );
    let in_handler = Arc::new(AtomicUsize::new(0));
    let max_in_handler = Arc::new(AtomicUsize::new(0));
    let fences = Arc::new(Mutex::new(Vec::new()));
    let threads = Arc::new(Mutex::new(HashSet::new()));
    let server = {
        let (in_handler, max_in_handler, fences, threads) = (
            in_handler.clone(),
            max_in_handler.clone(),
            fences.clone(),
            threads.clone(),
        );
        let server = HttpServer::new(move || {
            let (in_handler, max_in_handler, fences, threads) = (
                in_handler.clone(),
                max_in_handler.clone(),
                fences.clone(),
                threads.clone(),
            );
            App::new().service(
                web::resource("/work")
                    .wrap(lock.clone())
                    .route(web::post().to(move |LockFence(fence): LockFence| {
                        let (in_handler, max_in_handler, fences, threads) = (
                            in_handler.clone(),
                            max_in_handler.clone(),
                            fences.clone(),
                            threads.clone(),
                        );
                        async move {
                            let now = in_handler.fetch_add(1, Ordering::SeqCst) + 1;
                            max_in_handler.fetch_max(now, Ordering::SeqCst);
                            threads.lock().unwrap().insert(std::thread::current().id());
                            fences.lock().unwrap().push(fence);
                            // Hold the handler open long enough for a request on another
                            // worker to overlap it, if the lock let one through.
                            tokio::time::sleep(Duration::from_millis(5)).await;
                            in_handler.fetch_sub(1, Ordering::SeqCst);
                            "done"
                        }
                    })),
            )
        })
        .workers(WORKERS)
        .disable_signals()
        .bind(("127.0.0.1", 0))
        .unwrap();
        let addr = server.addrs()[0];
        Arc::new(spawn_actix(server.run(), addr))
    };

    let mut tasks = Vec::new();
    for _ in 0..N {
        let server = server.clone();
        tasks.push(tokio::spawn(async move {
            server.post("/work", &[("x-key", "k")]).await
        }));
    }
    for task in tasks {
        let reply = task.await.unwrap();
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    }
    assert_eq!(
        max_in_handler.load(Ordering::SeqCst),
        1,
        "handlers overlapped"
    );
    let fences = fences.lock().unwrap().clone();
    assert_eq!(fences.len(), N);
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "fences increase in handler order: {fences:?}"
    );
    // The exclusion held across threads, not merely within one worker.
    assert!(
        threads.lock().unwrap().len() > 1,
        "all requests were served by one worker"
    );
}

/// The tower layer (axum) and the actix middleware, built from one configuration on one
/// engine, must answer alike.
async fn both(make: impl Fn() -> LockLayerBuilder) -> (TestServer, TestServer) {
    let tower = serve_axum(
        axum::Router::new()
            .route("/work", axum::routing::post(|| async { "ok" }))
            .route_layer(make().build().unwrap()),
    )
    .await;
    let actix = actix_ok(make().build_locker().unwrap());
    (tower, actix)
}

fn assert_same_rejection(tower: &Reply, actix: &Reply, status: StatusCode) {
    assert_eq!(tower.status, status, "tower: {}", tower.text());
    assert_eq!(actix.status, status, "actix: {}", actix.text());
    for name in ["content-type", "retry-after"] {
        assert_eq!(tower.header(name), actix.header(name), "{name}");
    }
    assert_eq!(
        actix.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(tower.json(), actix.json());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_key_is_answered_423_like_the_tower_layer() {
    let engine = LockEngine::in_memory();
    let (tower, actix) = both(|| LockLayer::builder(engine.clone()).key(header_key())).await;
    let _held = engine
        .lock(lock_key("k"))
        .ttl(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap();
    let t = tower.post("/work", &[("x-key", "k")]).await;
    let a = actix.post("/work", &[("x-key", "k")]).await;
    assert_same_rejection(&t, &a, StatusCode::LOCKED);
    assert_eq!(a.header("retry-after"), Some("10"));
    assert_eq!(a.json()["type"], "urn:tower-lock:problem:locked");
    // Another key is free.
    assert_eq!(
        actix.post("/work", &[("x-key", "j")]).await.status,
        StatusCode::OK
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_that_runs_out_is_answered_429_like_the_tower_layer() {
    let engine = LockEngine::in_memory();
    let (tower, actix) = both(|| {
        LockLayer::builder(engine.clone())
            .key(header_key())
            .wait(Duration::from_millis(50))
    })
    .await;
    let _held = engine
        .lock(lock_key("k"))
        .ttl(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap();
    let t = tower.post("/work", &[("x-key", "k")]).await;
    let a = actix.post("/work", &[("x-key", "k")]).await;
    // The detail says how long each waited, to the millisecond; everything else matches.
    let (mut tj, mut aj) = (t.json(), a.json());
    assert!(aj["detail"].as_str().unwrap().starts_with("waited "));
    tj["detail"] = "".into();
    aj["detail"] = "".into();
    assert_eq!(tj, aj);
    assert_eq!(t.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(a.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(t.header("retry-after"), a.header("retry-after"));
    assert_eq!(aj["type"], "urn:tower-lock:problem:wait-timed-out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_wait_queue_is_answered_429_like_the_tower_layer() {
    let engine = LockEngine::in_memory();
    let (tower, actix) = both(|| {
        LockLayer::builder(engine.clone())
            .key(header_key())
            .wait(Duration::from_secs(10))
            .max_waiters(1)
    })
    .await;
    let _held = engine
        .lock(lock_key("k"))
        .ttl(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap();
    // One waiter fills the queue of the key (a waiter limit of 0 is refused at build time).
    let _waiter = tokio::spawn({
        let lock = engine.lock(lock_key("k")).wait(Duration::from_secs(10));
        async move { lock.acquire().await }
    });
    tokio::time::timeout(Duration::from_secs(10), async {
        // The engine offers no event for "a waiter queued"; look again shortly.
        while engine.lock(lock_key("k")).waiters().await.unwrap() < 1 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await
    .expect("the waiter queues within 10 s");
    let t = tower.post("/work", &[("x-key", "k")]).await;
    let a = actix.post("/work", &[("x-key", "k")]).await;
    assert_same_rejection(&t, &a, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(a.json()["type"], "urn:tower-lock:problem:too-many-waiters");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotency_preset_answers_400_and_409_like_the_tower_layer() {
    let engine = LockEngine::in_memory();
    let (tower, actix) = both(|| LockLayer::idempotency(engine.clone())).await;

    let t = tower.post("/work", &[]).await;
    let a = actix.post("/work", &[]).await;
    assert_same_rejection(&t, &a, StatusCode::BAD_REQUEST);
    assert_eq!(a.json()["type"], "urn:tower-lock:problem:missing-key");
    assert_eq!(a.header("retry-after"), None);

    let t = tower
        .post("/work", &[("idempotency-key", "\"unterminated")])
        .await;
    let a = actix
        .post("/work", &[("idempotency-key", "\"unterminated")])
        .await;
    assert_same_rejection(&t, &a, StatusCode::BAD_REQUEST);
    assert_eq!(a.json()["type"], "urn:tower-lock:problem:malformed-key");

    let _held = engine
        .lock(tower_lock::key::encode("", "idempotency-key", "order-1"))
        .ttl(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap();
    let t = tower
        .post("/work", &[("idempotency-key", "\"order-1\"")])
        .await;
    let a = actix.post("/work", &[("idempotency-key", "order-1")]).await;
    assert_same_rejection(&t, &a, StatusCode::CONFLICT);
    assert_eq!(a.json()["type"], "urn:tower-lock:problem:conflict");

    let ok = actix
        .post("/work", &[("idempotency-key", "\"order-2\"")])
        .await;
    assert_eq!(ok.status, StatusCode::OK);
}

/// An actix server whose `/stream` handler hands the test the sender of its body.
fn streaming_server(
    engine: &LockEngine,
) -> (TestServer, mpsc::UnboundedReceiver<mpsc::Sender<Bytes>>) {
    streaming_server_releasing_at(engine, ReleasePoint::BodyEnd)
}

fn streaming_server_releasing_at(
    engine: &LockEngine,
    release: ReleasePoint,
) -> (TestServer, mpsc::UnboundedReceiver<mpsc::Sender<Bytes>>) {
    let lock = LockMiddleware::new(
        LockLayer::builder(engine.clone())
            .key(header_key())
            .ttl(Duration::from_secs(60))
            .release_at(release)
            .build_locker()
            .unwrap(),
    );
    let (senders_tx, senders_rx) = mpsc::unbounded_channel();
    let server = HttpServer::new(move || {
        let senders_tx = senders_tx.clone();
        App::new().service(
            web::resource("/stream")
                .wrap(lock.clone())
                .route(web::post().to(move || {
                    let senders_tx = senders_tx.clone();
                    async move {
                        let (tx, body) = channel_body();
                        tx.send(Bytes::from_static(b"first\n")).await.unwrap();
                        senders_tx.send(tx).unwrap();
                        HttpResponse::Ok().body(body)
                    }
                })),
        )
    })
    .workers(WORKERS)
    .disable_signals()
    .bind(("127.0.0.1", 0))
    .unwrap();
    let addr = server.addrs()[0];
    (spawn_actix(server.run(), addr), senders_rx)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_body_keeps_the_key_locked_until_its_last_chunk() {
    let engine = LockEngine::in_memory();
    let (server, mut senders) = streaming_server(&engine);
    let res = server
        .send_streaming("POST", "/stream", &[("x-key", "k")])
        .await;
    assert_eq!(res.status(), StatusCode::OK);
    let tx = senders.recv().await.unwrap();
    let mut body = res.into_body();
    let frame = body.frame().await.unwrap().unwrap();
    assert_eq!(frame.into_data().unwrap(), "first\n");

    // The handler has returned, the body is still streaming: the key is held.
    assert!(engine.lock(lock_key("k")).try_acquire().await.is_err());
    let again = server.post("/stream", &[("x-key", "k")]).await;
    assert_eq!(again.status, StatusCode::LOCKED);

    tx.send(Bytes::from_static(b"last\n")).await.unwrap();
    drop(tx);
    let rest = body.collect().await.unwrap().to_bytes();
    assert_eq!(rest, "last\n");
    // Released once the body ended (in the background): a waiter gets it.
    engine
        .lock(lock_key("k"))
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .expect("the key is released after the last chunk");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnecting_client_frees_the_key() {
    let engine = LockEngine::in_memory();
    let (server, mut senders) = streaming_server(&engine);
    let mut stream = tokio::net::TcpStream::connect(server.addr()).await.unwrap();
    stream
        .write_all(b"POST /stream HTTP/1.1\r\nhost: t\r\nx-key: k\r\ncontent-length: 0\r\n\r\n")
        .await
        .unwrap();
    let mut head = vec![0u8; 1024];
    let mut got = 0;
    while !String::from_utf8_lossy(&head[..got]).contains("first") {
        got += stream.read(&mut head[got..]).await.unwrap();
    }
    let tx = senders.recv().await.unwrap();
    assert!(engine.lock(lock_key("k")).try_acquire().await.is_err());
    drop(stream);

    // actix notices a closed connection when it next writes to it (actix-web#1313): keep
    // the body producing until actix drops it, which the sender sees as a closed channel.
    tokio::time::timeout(Duration::from_secs(10), async {
        while tx.send(Bytes::from_static(b"more\n")).await.is_ok() {}
    })
    .await
    .expect("the server drops the body when the client goes away");
    engine
        .lock(lock_key("k"))
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .expect("the key is released when the client leaves mid-body");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extractors_see_the_lease_or_fail_with_500_without_one() {
    let lock = LockMiddleware::new(
        LockLayer::builder(LockEngine::in_memory())
            .key(header_key())
            .namespace("t")
            .build_locker()
            .unwrap(),
    );
    let server = HttpServer::new(move || {
        App::new()
            .service(
                web::resource("/locked")
                    .wrap(lock.clone())
                    .route(web::post().to(
                        |Locked(info): Locked, LockFence(fence): LockFence| async move {
                            assert_eq!(info.fence(), fence);
                            format!("{} {}", info.key(), fence.get())
                        },
                    )),
            )
            .route(
                "/bare",
                web::post().to(|lease: Option<Locked>| async move {
                    format!("lease: {}", lease.is_some())
                }),
            )
            .route("/needs-lock", web::post().to(|_: Locked| async { "never" }))
    })
    .workers(1)
    .disable_signals()
    .bind(("127.0.0.1", 0))
    .unwrap();
    let addr = server.addrs()[0];
    let server = spawn_actix(server.run(), addr);

    let reply = server.post("/locked", &[("x-key", "k")]).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert!(
        reply.text().starts_with("t/header=x-key/k "),
        "{}",
        reply.text()
    );
    assert_eq!(server.post("/bare", &[]).await.text(), "lease: false");
    let reply = server.post("/needs-lock", &[]).await;
    assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(reply.text().contains("middleware"), "{}", reply.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejection_hook_answers_on_actix_as_on_the_tower_layer() {
    let engine = LockEngine::in_memory();
    let (tower, actix) = both(|| {
        LockLayer::builder(engine.clone())
            .key(header_key())
            .on_reject(|rejection| {
                let mut res =
                    http::Response::new(Bytes::from(format!("busy: {}\n", rejection.kind())));
                *res.status_mut() = rejection.status();
                res.headers_mut()
                    .insert("content-type", "text/plain".parse().unwrap());
                res.headers_mut().insert("x-lock", "held".parse().unwrap());
                res
            })
    })
    .await;
    let _held = engine.lock(lock_key("k")).acquire().await.unwrap();
    let t = tower.post("/work", &[("x-key", "k")]).await;
    let a = actix.post("/work", &[("x-key", "k")]).await;
    assert_eq!(a.status, StatusCode::LOCKED);
    assert_eq!(t.status, a.status);
    for name in ["content-type", "x-lock"] {
        assert_eq!(t.header(name), a.header(name), "{name}");
    }
    assert_eq!(a.text(), "busy: locked\n");
    assert_eq!(t.body, a.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_at_response_ready_frees_the_key_while_the_body_streams() {
    let engine = LockEngine::in_memory();
    let (server, mut senders) = streaming_server_releasing_at(&engine, ReleasePoint::ResponseReady);
    let res = server
        .send_streaming("POST", "/stream", &[("x-key", "k")])
        .await;
    assert_eq!(res.status(), StatusCode::OK);
    let tx = senders.recv().await.unwrap();
    let mut body = res.into_body();
    let frame = body.frame().await.unwrap().unwrap();
    assert_eq!(frame.into_data().unwrap(), "first\n");
    // The body is still open, and yet the key is free.
    engine
        .lock(lock_key("k"))
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .expect("the key is released when the response is ready");
    drop(tx);
}
