//! The actix middleware on the Redis backend, through a real socket: a redis-server of the
//! test's own, actix `HttpServer`s with several workers, a hyper-util client.

mod support;

use std::{
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
use support::{TestServer, channel_body, serve_axum, spawn_actix};
use tokio::sync::mpsc;
use tower_lock::{LockEngine, LockLayer, engine::redis::RedisBackend, key::HeaderKey};
use tower_lock_actix::{LockFence, LockMiddleware};
use tower_lock_test_support::redis::RedisServer;

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

/// An engine on `server` (one per simulated node), keys under `prefix`.
async fn node(server: &RedisServer, prefix: &str) -> LockEngine {
    let backend = RedisBackend::builder(server.url())
        .prefix(prefix)
        .build()
        .await
        .expect("redis backend");
    LockEngine::new(backend)
}

/// An actix server with `WORKERS` workers whose `/work` handler records how many requests
/// are inside it at once and the fences it saw, and reports each arrival.
struct Recorder {
    inside: Arc<AtomicUsize>,
    most_inside: Arc<AtomicUsize>,
    fences: Arc<Mutex<Vec<u64>>>,
}

fn recording_server(lock: LockMiddleware, rec: &Recorder, hold: Duration) -> TestServer {
    let (inside, most, fences) = (
        rec.inside.clone(),
        rec.most_inside.clone(),
        rec.fences.clone(),
    );
    let server = HttpServer::new(move || {
        let (inside, most, fences) = (inside.clone(), most.clone(), fences.clone());
        App::new().service(
            web::resource("/work")
                .wrap(lock.clone())
                .route(web::post().to(move |LockFence(fence): LockFence| {
                    let (inside, most, fences) = (inside.clone(), most.clone(), fences.clone());
                    async move {
                        let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        fences.lock().unwrap().push(fence.get());
                        // Long enough for a request on another worker or node to overlap it,
                        // if the lock let one through.
                        tokio::time::sleep(hold).await;
                        inside.fetch_sub(1, Ordering::SeqCst);
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
    spawn_actix(server.run(), addr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_with_one_key_never_overlap_across_workers_and_nodes() {
    let redis = RedisServer::start();
    let rec = Recorder {
        inside: Arc::default(),
        most_inside: Arc::default(),
        fences: Arc::default(),
    };
    // Two nodes (two engines on one Redis), each an actix server with several workers.
    let mut servers = Vec::new();
    for _ in 0..2 {
        let lock = LockMiddleware::new(
            LockLayer::builder(node(&redis, "actix").await)
                .key(header_key())
                .wait(Duration::from_secs(30))
                .fifo(true)
                .build_policy()
                .unwrap(),
        );
        servers.push(Arc::new(recording_server(
            lock,
            &rec,
            Duration::from_millis(5),
        )));
    }
    let mut tasks = Vec::new();
    for i in 0..16 {
        let server = servers[i % 2].clone();
        tasks.push(tokio::spawn(async move {
            server.post("/work", &[("x-key", "k")]).await
        }));
    }
    for task in tasks {
        let reply = task.await.unwrap();
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    }
    assert_eq!(
        rec.most_inside.load(Ordering::SeqCst),
        1,
        "handlers overlapped"
    );
    let fences = rec.fences.lock().unwrap().clone();
    assert_eq!(fences.len(), 16);
    assert!(fences.windows(2).all(|w| w[0] < w[1]), "{fences:?}");
    // Nothing is left but the documented fence tombstone.
    let left: Vec<String> = redis
        .scan("actix:*")
        .into_iter()
        .filter(|k| !k.contains(":fence:"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_and_timed_out_keys_are_answered_like_the_tower_layer() {
    let redis = RedisServer::start();
    let engine = node(&redis, "answers").await;
    let make = |wait: Duration| {
        LockLayer::builder(engine.clone())
            .key(header_key())
            .wait(wait)
    };
    let tower_locked = serve_axum(
        axum::Router::new()
            .route("/work", axum::routing::post(|| async { "ok" }))
            .route_layer(make(Duration::ZERO).build().unwrap()),
    )
    .await;
    let rec = Recorder {
        inside: Arc::default(),
        most_inside: Arc::default(),
        fences: Arc::default(),
    };
    let actix_locked = recording_server(
        make(Duration::ZERO).build_policy().unwrap().into(),
        &rec,
        Duration::ZERO,
    );
    let actix_waiting = recording_server(
        make(Duration::from_millis(100))
            .build_policy()
            .unwrap()
            .into(),
        &rec,
        Duration::ZERO,
    );

    let held = engine
        .lock(lock_key("k"))
        .ttl(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap();
    let t = tower_locked.post("/work", &[("x-key", "k")]).await;
    let a = actix_locked.post("/work", &[("x-key", "k")]).await;
    assert_eq!(t.status, StatusCode::LOCKED);
    assert_eq!(a.status, StatusCode::LOCKED);
    assert_eq!(a.header("content-type"), Some("application/problem+json"));
    assert_eq!(t.header("retry-after"), a.header("retry-after"));
    assert_eq!(t.json(), a.json());
    let timed_out = actix_waiting.post("/work", &[("x-key", "k")]).await;
    assert_eq!(timed_out.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        timed_out.json()["type"],
        "urn:tower-lock:problem:wait-timed-out"
    );
    let retry: u64 = timed_out.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=10).contains(&retry), "Retry-After {retry}");
    assert_eq!(
        rec.fences.lock().unwrap().len(),
        0,
        "no handler ran while held"
    );

    held.release().await.unwrap();
    assert_eq!(
        actix_locked.post("/work", &[("x-key", "k")]).await.status,
        StatusCode::OK
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streaming_body_holds_the_key_until_its_last_chunk() {
    let redis = RedisServer::start();
    let engine = node(&redis, "stream").await;
    let lock: LockMiddleware = LockLayer::builder(engine.clone())
        .key(header_key())
        .build_policy()
        .unwrap()
        .into();
    // Each request's handler hands the test the sender of its streaming body.
    let (senders_tx, mut senders) = mpsc::unbounded_channel::<mpsc::Sender<Bytes>>();
    let server = HttpServer::new(move || {
        let senders_tx = senders_tx.clone();
        App::new().service(
            web::resource("/stream")
                .wrap(lock.clone())
                .route(web::post().to(move || {
                    let senders_tx = senders_tx.clone();
                    async move {
                        let (tx, body) = channel_body();
                        senders_tx.send(tx).unwrap();
                        HttpResponse::Ok().body(body)
                    }
                })),
        )
    })
    .workers(2)
    .disable_signals()
    .bind(("127.0.0.1", 0))
    .unwrap();
    let addr = server.addrs()[0];
    let server = spawn_actix(server.run(), addr);

    let response = server
        .send_streaming("POST", "/stream", &[("x-key", "k")])
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    let tx = senders.recv().await.unwrap();
    tx.send(Bytes::from_static(b"first")).await.unwrap();
    let mut body = response.into_body();
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(&first[..], b"first");
    // The handler has returned, the body is still streaming: the key is held on Redis.
    assert!(engine.lock(lock_key("k")).locked().await.unwrap());
    drop(tx); // the body ends
    assert!(body.frame().await.is_none());
    // Freed at body end, long before its 30 s TTL.
    let next = engine
        .lock(lock_key("k"))
        .wait(Duration::from_secs(5))
        .acquire()
        .await
        .expect("free after the last chunk");
    next.release().await.unwrap();
}
