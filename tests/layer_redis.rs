//! The layer through a real server socket (axum on 127.0.0.1:0, hyper-util client), on
//! the Redis backend: ordering, status codes, release points and residue on a shared
//! redis-server (each test under its own key prefix), and outages on a server of the
//! test's own (killed, restarted, paused, frozen).
#![cfg(feature = "redis")]

mod support;

use std::{
    sync::{
        Arc,
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
use support::http::{Gate, GateControl, Reply, TestServer, channel_body, gate, serve};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    sync::{mpsc, oneshot},
    task::JoinHandle,
    time::Instant,
};
use tower_lock::{
    BackendFailurePolicy, LeaseInfo, LockEngine, LockLayer, engine::redis::RedisBackend,
    key::HeaderKey,
};
use tower_lock_test_support::redis::RedisServer;

/// The command timeout of the fault tests' engines: short, so an outage is answered fast.
const SHORT_TIMEOUT: Duration = Duration::from_millis(200);

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

/// The lock key of a request with `idempotency-key: <value>` to the idempotency preset.
fn idempotency_lock_key(value: &str) -> String {
    tower_lock::key::encode("", "idempotency-key", value)
}

/// An engine on `server` under `prefix` (the test's own namespace), with the default
/// command timeout or `timeout`.
async fn redis_engine(server: &RedisServer, prefix: &str, timeout: Option<Duration>) -> LockEngine {
    let mut builder = RedisBackend::builder(server.url()).prefix(prefix);
    if let Some(timeout) = timeout {
        builder = builder.command_timeout(timeout);
    }
    LockEngine::new(
        builder
            .build()
            .await
            .expect("connect to the test redis-server"),
    )
}

/// An engine on the binary's shared server, under the prefix `layer-redis-<name>`.
async fn shared_engine(name: &str) -> (LockEngine, String) {
    let prefix = format!("layer-redis-{name}");
    (
        redis_engine(RedisServer::shared(), &prefix, None).await,
        prefix,
    )
}

/// `POST path` handled by a handler that waits at `gate` (reporting its `x-seq` header)
/// and answers with its lease's fence: `fence:F`, `degraded:F`, or `unlocked`.
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

/// `POST path` with `x-key: key`, sent in the background.
fn spawn_post(server: &Arc<TestServer>, path: &'static str, key: &str) -> JoinHandle<Reply> {
    let (server, key) = (server.clone(), key.to_owned());
    tokio::spawn(async move { server.post(path, &[("x-key", &key)]).await })
}

/// Wait until a handler arrives at the gate; if the request is answered first, fail
/// with its answer.
async fn arrives(control: &mut GateControl, request: &mut JoinHandle<Reply>) -> String {
    tokio::select! {
        who = control.arrived() => who,
        reply = request => {
            let reply = reply.unwrap();
            panic!("answered {} before reaching the handler: {}", reply.status, reply.text())
        }
    }
}

/// `POST path` with `headers` while another request with the same key is inside the
/// handler: answered without entering the handler (fails at once if it does enter).
async fn post_refused(
    server: &Arc<TestServer>,
    path: &'static str,
    headers: &[(&str, &str)],
    control: &mut GateControl,
) -> Reply {
    let server = server.clone();
    let headers: Vec<(String, String)> = headers
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    let mut request = tokio::spawn(async move {
        let headers: Vec<(&str, &str)> = headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        server.post(path, &headers).await
    });
    tokio::select! {
        reply = &mut request => reply.unwrap(),
        _ = control.arrived() => panic!("a second request with the same key entered the handler"),
    }
}

async fn wait_for_waiters(engine: &LockEngine, key: &str, n: usize) {
    tokio::time::timeout(Duration::from_secs(10), async {
        // The engine offers no event for "a waiter queued"; look again shortly.
        while engine.lock(key).waiters().await.unwrap() < n {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{n} waiters queue on {key} within 10 s"));
}

/// Check a rejection: `status`, `Retry-After` (whole seconds, at least 1) and an
/// `application/problem+json` body of type `urn:tower-lock:problem:<kind>` that agrees.
/// Returns the `Retry-After` seconds.
fn assert_problem(reply: &Reply, status: StatusCode, kind: &str) -> u64 {
    assert_eq!(reply.status, status, "{}", reply.text());
    assert_eq!(
        reply.header("content-type"),
        Some("application/problem+json")
    );
    let retry: u64 = reply
        .header("retry-after")
        .expect("a Retry-After header")
        .parse()
        .expect("Retry-After in whole seconds");
    assert!(retry >= 1, "Retry-After {retry}");
    let problem = reply.json();
    assert_eq!(problem["type"], format!("urn:tower-lock:problem:{kind}"));
    assert_eq!(problem["status"], status.as_u16());
    assert_eq!(problem["retry_after"], retry);
    assert!(problem["title"].is_string() && problem["detail"].is_string());
    retry
}

/// Wait (event-driven) until the lease of a finished request is released, which happens in
/// the background once its body ends: take the key and give it back.
async fn until_free(engine: &LockEngine, key: &str) {
    engine
        .lock(key)
        .wait(Duration::from_secs(5))
        .acquire()
        .await
        .unwrap_or_else(|e| panic!("{key} is free within 5 s: {e}"))
        .release()
        .await
        .unwrap();
}

/// Once the requests are done, nothing is left under `prefix` but fence tombstones, each
/// with a TTL. Each of `keys` is first taken and released through the engine, which
/// waits (event-driven, well under any lease TTL) for releases still in flight.
async fn assert_no_residue(
    server: &RedisServer,
    engine: &LockEngine,
    prefix: &str,
    keys: &[String],
) {
    for key in keys {
        until_free(engine, key).await;
    }
    let left = tokio::task::block_in_place(|| {
        let mut left = Vec::new();
        for key in server.scan(&format!("{prefix}:*")) {
            let tombstone = key
                .split_once("}:")
                .is_some_and(|(_, rest)| rest.starts_with("fence:"));
            if tombstone {
                let ttl: i64 = server.cli(["PTTL", &key]).parse().unwrap();
                assert!(ttl > 0, "tombstone {key} has no TTL ({ttl})");
            } else {
                left.push(key);
            }
        }
        left
    });
    assert!(left.is_empty(), "residue under {prefix}: {left:?}");
}

/// A request inside the handler: its sequence number, its fence, and what lets it finish.
type Arrival = (usize, u64, oneshot::Sender<()>);

async fn next_arrival(arrivals: &mut mpsc::UnboundedReceiver<Arrival>) -> Arrival {
    tokio::time::timeout(Duration::from_secs(10), arrivals.recv())
        .await
        .expect("the next request enters the handler within 10 s")
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifo_requests_with_one_key_never_overlap_and_run_in_arrival_order() {
    const N: usize = 8;
    const ROUNDS: usize = 3;
    const NODES: usize = 3;
    let prefix = "layer-redis-fifo";
    let in_handler = Arc::new(AtomicUsize::new(0));
    let max_in_handler = Arc::new(AtomicUsize::new(0));
    // Each handler reports (seq, fence) and stays inside until the test lets it go.
    let (arrivals_tx, mut arrivals_rx) = mpsc::unbounded_channel::<Arrival>();
    let app = {
        let (in_handler, max_in_handler) = (in_handler.clone(), max_in_handler.clone());
        Router::new().route(
            "/work",
            post(move |Extension(info): Extension<LeaseInfo>, req: Request| {
                let (in_handler, max_in_handler, arrivals_tx) = (
                    in_handler.clone(),
                    max_in_handler.clone(),
                    arrivals_tx.clone(),
                );
                async move {
                    let now = in_handler.fetch_add(1, Ordering::SeqCst) + 1;
                    max_in_handler.fetch_max(now, Ordering::SeqCst);
                    let seq: usize = req.headers()["x-seq"].to_str().unwrap().parse().unwrap();
                    let (go_tx, go_rx) = oneshot::channel();
                    arrivals_tx.send((seq, info.fence().get(), go_tx)).unwrap();
                    go_rx.await.unwrap();
                    // Give a concurrent handler every chance to overlap this one.
                    for _ in 0..10 {
                        tokio::task::yield_now().await;
                    }
                    in_handler.fetch_sub(1, Ordering::SeqCst);
                    "done"
                }
            }),
        )
    };
    // A fleet: each server has its own engine (pool and subscriber) on the one Redis, so
    // the order comes from the Redis ticket queue, not from one process's local waiters.
    let mut engines = Vec::new();
    let mut servers = Vec::new();
    for _ in 0..NODES {
        let engine = redis_engine(RedisServer::shared(), prefix, None).await;
        let layer = LockLayer::builder(engine.clone())
            .key(header_key())
            .wait(Duration::from_secs(20))
            .fifo(true)
            .build()
            .unwrap();
        servers.push(Arc::new(serve(app.clone().route_layer(layer)).await));
        engines.push(engine);
    }
    let engine = &engines[0];

    let mut last_fence = 0;
    for round in 0..ROUNDS {
        let mut tasks = Vec::new();
        let mut inside = None;
        for seq in 0..N {
            let server = servers[seq % NODES].clone();
            tasks.push(tokio::spawn(async move {
                server
                    .post("/work", &[("x-key", "k"), ("x-seq", &seq.to_string())])
                    .await
            }));
            if seq == 0 {
                inside = Some(next_arrival(&mut arrivals_rx).await);
            } else {
                // Arrival order is the order of the Redis ticket queue (waiters on all
                // nodes count).
                wait_for_waiters(engine, &lock_key("k"), seq).await;
            }
        }
        for expected in 0..N {
            let (seq, fence, go) = inside.take().unwrap();
            assert_eq!(seq, expected, "round {round}: grants follow arrival order");
            assert!(fence > last_fence, "round {round}: fences increase");
            last_fence = fence;
            assert_eq!(
                in_handler.load(Ordering::SeqCst),
                1,
                "round {round}: request {seq} is alone in the handler"
            );
            go.send(()).unwrap();
            if expected + 1 < N {
                inside = Some(next_arrival(&mut arrivals_rx).await);
            }
        }
        for task in tasks {
            let reply = task.await.unwrap();
            assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
        }
    }
    assert_eq!(max_in_handler.load(Ordering::SeqCst), 1);
    assert_no_residue(RedisServer::shared(), engine, prefix, &[lock_key("k")]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_requests_without_fifo_never_overlap() {
    const N: usize = 8;
    let (engine, prefix) = shared_engine("no-fifo").await;
    let layer = LockLayer::builder(engine.clone())
        .key(header_key())
        .wait(Duration::from_secs(20))
        .build()
        .unwrap();
    let in_handler = Arc::new(AtomicUsize::new(0));
    let max_in_handler = Arc::new(AtomicUsize::new(0));
    let (gate, mut control) = gate();
    let app = {
        let (in_handler, max_in_handler) = (in_handler.clone(), max_in_handler.clone());
        Router::new()
            .route(
                "/work",
                post(move || {
                    let (in_handler, max_in_handler, gate) =
                        (in_handler.clone(), max_in_handler.clone(), gate.clone());
                    async move {
                        let now = in_handler.fetch_add(1, Ordering::SeqCst) + 1;
                        max_in_handler.fetch_max(now, Ordering::SeqCst);
                        gate.pass(String::new()).await;
                        for _ in 0..10 {
                            tokio::task::yield_now().await;
                        }
                        in_handler.fetch_sub(1, Ordering::SeqCst);
                        "done"
                    }
                }),
            )
            .route_layer(layer)
    };
    let server = Arc::new(serve(app).await);
    let mut first = spawn_post(&server, "/work", "k");
    arrives(&mut control, &mut first).await;
    let mut tasks = vec![first];
    for _ in 1..N {
        tasks.push(spawn_post(&server, "/work", "k"));
    }
    wait_for_waiters(&engine, &lock_key("k"), N - 1).await;
    // Everyone queued behind the holder: no second handler got in meanwhile.
    assert_eq!(control.try_arrived(), None);
    control.open();
    for task in tasks {
        let reply = task.await.unwrap();
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    }
    assert_eq!(max_in_handler.load(Ordering::SeqCst), 1);
    assert_no_residue(RedisServer::shared(), &engine, &prefix, &[lock_key("k")]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_key_is_answered_423_with_retry_after_and_problem_json() {
    let (engine, prefix) = shared_engine("locked").await;
    let layer = LockLayer::builder(engine.clone())
        .key(header_key())
        .ttl(Duration::from_millis(2_500))
        .build()
        .unwrap();
    let (gate, mut control) = gate();
    let server = Arc::new(serve(gated_route("/work", layer, gate)).await);

    let mut first = spawn_post(&server, "/work", "k");
    arrives(&mut control, &mut first).await;
    let second = post_refused(&server, "/work", &[("x-key", "k")], &mut control).await;
    // Retry-After comes from the holder's remaining TTL on Redis (at most 2.5 s).
    let retry = assert_problem(&second, StatusCode::LOCKED, "locked");
    assert!((1..=3).contains(&retry), "Retry-After {retry}");

    // Another key is not affected.
    let mut other = spawn_post(&server, "/work", "other");
    arrives(&mut control, &mut other).await;
    control.open();
    assert!(first.await.unwrap().text().starts_with("fence:"));
    assert!(other.await.unwrap().text().starts_with("fence:"));
    assert_no_residue(
        RedisServer::shared(),
        &engine,
        &prefix,
        &[lock_key("k"), lock_key("other")],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_that_runs_out_is_answered_429_with_retry_after() {
    let (engine, prefix) = shared_engine("timed-out").await;
    let layer = LockLayer::builder(engine.clone())
        .key(header_key())
        .wait(Duration::from_millis(150))
        .build()
        .unwrap();
    let (gate, mut control) = gate();
    let server = Arc::new(serve(gated_route("/work", layer, gate)).await);
    let mut first = spawn_post(&server, "/work", "k");
    arrives(&mut control, &mut first).await;
    let started = Instant::now();
    let second = post_refused(&server, "/work", &[("x-key", "k")], &mut control).await;
    assert!(started.elapsed() >= Duration::from_millis(150), "it waited");
    assert_problem(&second, StatusCode::TOO_MANY_REQUESTS, "wait-timed-out");
    // The waiter that gave up left the queue.
    assert_eq!(engine.lock(lock_key("k")).waiters().await.unwrap(), 0);
    control.open();
    assert_eq!(first.await.unwrap().status, StatusCode::OK);
    assert_no_residue(RedisServer::shared(), &engine, &prefix, &[lock_key("k")]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_wait_queue_is_answered_429_at_once() {
    let (engine, prefix) = shared_engine("queue-full").await;
    let layer = LockLayer::builder(engine.clone())
        .key(header_key())
        .wait(Duration::from_secs(20))
        .max_waiters(1)
        .build()
        .unwrap();
    let (gate, mut control) = gate();
    let server = Arc::new(serve(gated_route("/work", layer, gate)).await);
    let mut first = spawn_post(&server, "/work", "k");
    arrives(&mut control, &mut first).await;
    let waiting = spawn_post(&server, "/work", "k");
    wait_for_waiters(&engine, &lock_key("k"), 1).await;
    let started = Instant::now();
    let third = post_refused(&server, "/work", &[("x-key", "k")], &mut control).await;
    assert_problem(&third, StatusCode::TOO_MANY_REQUESTS, "too-many-waiters");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "answered at once, not after a wait: {:?}",
        started.elapsed()
    );
    control.open();
    assert_eq!(first.await.unwrap().status, StatusCode::OK);
    assert_eq!(waiting.await.unwrap().status, StatusCode::OK);
    assert_no_residue(RedisServer::shared(), &engine, &prefix, &[lock_key("k")]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotency_duplicate_in_flight_is_answered_409() {
    let (engine, prefix) = shared_engine("idempotency").await;
    let layer = LockLayer::idempotency(engine.clone()).build().unwrap();
    let (gate, mut control) = gate();
    let server = Arc::new(serve(gated_route("/work", layer, gate)).await);

    let missing = server.post("/work", &[]).await;
    assert_eq!(missing.status, StatusCode::BAD_REQUEST);
    assert_eq!(missing.json()["type"], "urn:tower-lock:problem:missing-key");

    let mut first = tokio::spawn({
        let server = server.clone();
        async move {
            server
                .post("/work", &[("idempotency-key", "\"abc\"")])
                .await
        }
    });
    arrives(&mut control, &mut first).await;
    // The bare form is the same key.
    let dup = post_refused(
        &server,
        "/work",
        &[("idempotency-key", "abc")],
        &mut control,
    )
    .await;
    assert_problem(&dup, StatusCode::CONFLICT, "conflict");
    control.open();
    assert!(first.await.unwrap().text().starts_with("fence:"));
    // Done, not in flight: the same key runs again.
    until_free(&engine, &idempotency_lock_key("abc")).await;
    let again = server.post("/work", &[("idempotency-key", "abc")]).await;
    assert_eq!(again.status, StatusCode::OK, "{}", again.text());
    assert_no_residue(
        RedisServer::shared(),
        &engine,
        &prefix,
        &[idempotency_lock_key("abc")],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_on_one_redis_exclude_each_other() {
    let prefix = "layer-redis-fleet";
    let server = RedisServer::shared();
    let (gate, mut control) = gate();
    let node = async |gate: Gate| {
        let engine = redis_engine(server, prefix, None).await;
        let layer = LockLayer::builder(engine.clone())
            .key(header_key())
            .build()
            .unwrap();
        (
            engine,
            Arc::new(serve(gated_route("/work", layer, gate)).await),
        )
    };
    let (engine_a, a) = node(gate.clone()).await;
    let (_engine_b, b) = node(gate).await;
    let mut held = spawn_post(&a, "/work", "k");
    arrives(&mut control, &mut held).await;
    let refused = post_refused(&b, "/work", &[("x-key", "k")], &mut control).await;
    assert_problem(&refused, StatusCode::LOCKED, "locked");
    control.open();
    assert_eq!(held.await.unwrap().status, StatusCode::OK);
    assert_no_residue(server, &engine_a, prefix, &[lock_key("k")]).await;
    let after = b.post("/work", &[("x-key", "k")]).await;
    assert_eq!(after.status, StatusCode::OK, "{}", after.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_body_keeps_the_key_locked_until_its_last_chunk() {
    let (engine, prefix) = shared_engine("streaming").await;
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

    for chunk in ["first", "second"] {
        tx.send(Bytes::from(chunk)).await.unwrap();
        let frame = body.frame().await.unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap(), chunk);
        // The handler has returned, the body is still open: the key is held on Redis.
        assert!(
            engine.lock(lock_key("k")).locked().await.unwrap(),
            "after {chunk}"
        );
    }
    let again = server.post("/stream", &[("x-key", "k")]).await;
    assert_problem(&again, StatusCode::LOCKED, "locked");

    tx.send(Bytes::from_static(b"last")).await.unwrap();
    drop(tx);
    let rest = body.collect().await.unwrap().to_bytes();
    assert_eq!(rest, "last");
    // Released once the body ended (in the background): a waiter gets it, far within the
    // 60 s lease TTL.
    let started = Instant::now();
    let lease = engine
        .lock(lock_key("k"))
        .wait(Duration::from_secs(5))
        .acquire()
        .await
        .expect("the key is released after the last chunk");
    assert!(started.elapsed() < Duration::from_secs(5));
    lease.release().await.unwrap();
    assert_no_residue(RedisServer::shared(), &engine, &prefix, &[lock_key("k")]).await;
}

/// Sends its signal when dropped: tells the test the server dropped the handler.
struct OnDrop(Option<oneshot::Sender<()>>);

impl Drop for OnDrop {
    fn drop(&mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnecting_client_frees_the_key() {
    let (engine, prefix) = shared_engine("disconnect").await;
    let layer = LockLayer::builder(engine.clone())
        .key(header_key())
        .ttl(Duration::from_secs(60))
        .build()
        .unwrap();
    let (entered_tx, mut entered_rx) = mpsc::unbounded_channel::<oneshot::Receiver<()>>();
    let app = Router::new()
        .route(
            "/hang",
            post(move || {
                let entered_tx = entered_tx.clone();
                async move {
                    let (dropped_tx, dropped_rx) = oneshot::channel();
                    let _guard = OnDrop(Some(dropped_tx));
                    entered_tx.send(dropped_rx).unwrap();
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
    let dropped = entered_rx.recv().await.unwrap();
    assert!(engine.lock(lock_key("k")).locked().await.unwrap());
    drop(stream);

    tokio::time::timeout(Duration::from_secs(10), dropped)
        .await
        .expect("the server drops the handler when the client goes away")
        .unwrap();
    // The TTL is a minute: getting the key within seconds means it was released.
    let started = Instant::now();
    engine
        .lock(lock_key("k"))
        .wait(Duration::from_secs(5))
        .acquire()
        .await
        .expect("the key is released when the client disconnects")
        .release()
        .await
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_no_residue(RedisServer::shared(), &engine, &prefix, &[lock_key("k")]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_leaving_in_the_middle_of_a_streamed_body_frees_the_key() {
    let (engine, prefix) = shared_engine("leave-mid-body").await;
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
        let n = stream.read(&mut head[got..]).await.unwrap();
        assert!(n > 0, "the connection closed early");
        got += n;
    }
    let tx = senders_rx.recv().await.unwrap();
    assert!(engine.lock(lock_key("k")).locked().await.unwrap());
    drop(stream);
    tokio::time::timeout(Duration::from_secs(10), tx.closed())
        .await
        .expect("the server drops the body when the client goes away");
    engine
        .lock(lock_key("k"))
        .wait(Duration::from_secs(5))
        .acquire()
        .await
        .expect("the key is released when the client leaves mid-body")
        .release()
        .await
        .unwrap();
    assert_no_residue(RedisServer::shared(), &engine, &prefix, &[lock_key("k")]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_redis_fails_closed_open_or_degraded_and_the_same_layer_locks_after_restart() {
    let prefix = "layer-redis-kill";
    let redis = RedisServer::start();
    let engine = redis_engine(&redis, prefix, Some(SHORT_TIMEOUT)).await;
    let layer = |policy| {
        LockLayer::builder(engine.clone())
            .key(header_key())
            .on_backend_failure(policy)
            .build()
            .unwrap()
    };
    let degrade = layer(BackendFailurePolicy::Degrade);
    let (gate, mut control) = gate();
    let app = Router::new()
        .merge(gated_route(
            "/closed",
            // The default policy: fail closed.
            LockLayer::builder(engine.clone())
                .key(header_key())
                .build()
                .unwrap(),
            gate.clone(),
        ))
        .merge(gated_route(
            "/open",
            layer(BackendFailurePolicy::FailOpen),
            gate.clone(),
        ))
        .merge(gated_route("/degrade", degrade.clone(), gate));
    let server = Arc::new(serve(app).await);

    // Up: locked on Redis.
    let mut up = spawn_post(&server, "/closed", "k");
    arrives(&mut control, &mut up).await;
    control.open();
    assert!(up.await.unwrap().text().starts_with("fence:"));
    control.close();

    tokio::task::block_in_place(|| redis.kill());

    // Fail closed: 503 + Retry-After, within the command timeout (plus scheduling slack),
    // not a hang.
    let started = Instant::now();
    let closed = server.post("/closed", &[("x-key", "k")]).await;
    let elapsed = started.elapsed();
    assert_problem(&closed, StatusCode::SERVICE_UNAVAILABLE, "lock-unavailable");
    assert!(
        elapsed < SHORT_TIMEOUT + Duration::from_millis(800),
        "503 after {elapsed:?}"
    );

    // Fail open: two requests with one key run at the same time, unlocked.
    let mut a = spawn_post(&server, "/open", "k");
    arrives(&mut control, &mut a).await;
    let mut b = spawn_post(&server, "/open", "k");
    arrives(&mut control, &mut b).await;
    control.open();
    assert_eq!(a.await.unwrap().text(), "unlocked");
    assert_eq!(b.await.unwrap().text(), "unlocked");
    control.close();

    // Degrade: serialized on this node by the in-process engine.
    let mut a = spawn_post(&server, "/degrade", "k");
    arrives(&mut control, &mut a).await;
    let b = post_refused(&server, "/degrade", &[("x-key", "k")], &mut control).await;
    assert_problem(&b, StatusCode::LOCKED, "locked");
    control.open();
    assert!(a.await.unwrap().text().starts_with("degraded:"));
    assert_eq!(degrade.metrics().snapshot().degraded, 1);
    control.close();

    tokio::task::block_in_place(|| redis.restart());

    // The same layers and engine, not rebuilt, lock on Redis again.
    let mut a = spawn_post(&server, "/closed", "k");
    arrives(&mut control, &mut a).await;
    let b = post_refused(&server, "/closed", &[("x-key", "k")], &mut control).await;
    assert_problem(&b, StatusCode::LOCKED, "locked");
    // Held on Redis, not in-process: the degrading layer sees it too.
    let c = post_refused(&server, "/degrade", &[("x-key", "k")], &mut control).await;
    assert_problem(&c, StatusCode::LOCKED, "locked");
    control.open();
    assert!(a.await.unwrap().text().starts_with("fence:"));
    until_free(&engine, &lock_key("k")).await;
    let d = server.post("/degrade", &[("x-key", "k")]).await;
    assert!(d.text().starts_with("fence:"), "{}", d.text());
    assert_no_residue(&redis, &engine, prefix, &[lock_key("k")]).await;
}

/// Degrade promises per-node serialization whatever Redis does: a request holding a key
/// on Redis excludes one that falls back to the in-process engine while Redis stalls, and a
/// request holding a degraded lease excludes one that finds Redis back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn degrade_never_runs_two_handlers_for_one_key_on_one_node_whatever_redis_does() {
    let prefix = "layer-redis-degrade-stall";
    let redis = RedisServer::start();
    let engine = redis_engine(&redis, prefix, Some(SHORT_TIMEOUT)).await;
    let layer = LockLayer::builder(engine.clone())
        .key(header_key())
        .on_backend_failure(BackendFailurePolicy::Degrade)
        .build()
        .unwrap();
    let (gate, mut control) = gate();
    let server = Arc::new(serve(gated_route("/degrade", layer.clone(), gate)).await);

    // A holds k on Redis.
    let mut a = spawn_post(&server, "/degrade", "k");
    arrives(&mut control, &mut a).await;
    // Redis stalls past the command timeout.
    let paused = tokio::task::block_in_place(|| redis.cli(["CLIENT", "PAUSE", "3000", "ALL"]));
    assert_eq!(paused, "OK");
    // B for k on the same node must not run while A runs.
    let b = post_refused(&server, "/degrade", &[("x-key", "k")], &mut control).await;
    assert_problem(&b, StatusCode::LOCKED, "locked");
    control.open();
    assert!(a.await.unwrap().text().starts_with("fence:"));
    control.close();

    // C runs degraded while Redis is still stalled...
    let mut c = spawn_post(&server, "/degrade", "k");
    arrives(&mut control, &mut c).await;
    // ...and D, arriving once Redis is back, must not run while C runs.
    tokio::task::block_in_place(|| {
        redis.cli(["CLIENT", "UNPAUSE"]);
        redis.wait_ready();
    });
    let d = post_refused(&server, "/degrade", &[("x-key", "k")], &mut control).await;
    assert_problem(&d, StatusCode::LOCKED, "locked");
    control.open();
    assert!(c.await.unwrap().text().starts_with("degraded:"));
    assert!(layer.metrics().snapshot().degraded >= 1);
    until_free(&engine, &lock_key("k")).await;
    let e = server.post("/degrade", &[("x-key", "k")]).await;
    assert!(e.text().starts_with("fence:"), "{}", e.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_redis_is_answered_503_within_the_command_timeout_not_a_hang() {
    let prefix = "layer-redis-pause";
    let redis = RedisServer::start();
    let engine = redis_engine(&redis, prefix, Some(SHORT_TIMEOUT)).await;
    let app = now_and_wait_app(&engine, Duration::from_secs(5));
    let server = serve(app).await;
    let up = server.post("/now", &[("x-key", "k")]).await;
    assert!(up.text().starts_with("fence:"), "{}", up.text());
    until_free(&engine, &lock_key("k")).await;

    const PAUSE: Duration = Duration::from_secs(2);
    let paused = tokio::task::block_in_place(|| {
        redis.cli(["CLIENT", "PAUSE", &PAUSE.as_millis().to_string(), "ALL"])
    });
    assert_eq!(paused, "OK");
    let started = Instant::now();
    let reply = server.post("/now", &[("x-key", "k")]).await;
    let elapsed = started.elapsed();
    assert_problem(&reply, StatusCode::SERVICE_UNAVAILABLE, "lock-unavailable");
    assert!(
        elapsed >= SHORT_TIMEOUT && elapsed < SHORT_TIMEOUT + Duration::from_millis(800),
        "503 after {elapsed:?}, not after the command timeout"
    );

    tokio::task::block_in_place(|| redis.wait_ready());
    // Once the pause ends the same layer locks again, and the key is not blocked for the
    // 30 s lease TTL by whatever the timed-out acquire left behind.
    let started = Instant::now();
    let after = server.post("/wait", &[("x-key", "k")]).await;
    assert!(after.text().starts_with("fence:"), "{}", after.text());
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_no_residue(&redis, &engine, prefix, &[lock_key("k")]).await;
}

/// Two routes on one engine: `/now` (wait 0) and `/wait` (waits up to `wait`).
fn now_and_wait_app(engine: &LockEngine, wait: Duration) -> Router {
    let (gate, control) = gate();
    control.open();
    Router::new()
        .merge(gated_route(
            "/now",
            LockLayer::builder(engine.clone())
                .key(header_key())
                .build()
                .unwrap(),
            gate.clone(),
        ))
        .merge(gated_route(
            "/wait",
            LockLayer::builder(engine.clone())
                .key(header_key())
                .wait(wait)
                .build()
                .unwrap(),
            gate,
        ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_redis_is_answered_503_and_the_grant_that_lands_late_is_released() {
    let prefix = "layer-redis-freeze";
    let redis = RedisServer::start();
    let engine = redis_engine(&redis, prefix, Some(SHORT_TIMEOUT)).await;
    let server = serve(now_and_wait_app(&engine, Duration::from_secs(3))).await;
    let up = server.post("/now", &[("x-key", "k")]).await;
    assert!(up.text().starts_with("fence:"), "{}", up.text());
    until_free(&engine, &lock_key("k")).await;

    // DEBUG SLEEP: the server reads nothing for a while, then executes what is on the wire.
    let thaw = tokio::task::block_in_place(|| redis.freeze(Duration::from_millis(1_500)));
    let started = Instant::now();
    let reply = server.post("/now", &[("x-key", "k")]).await;
    let elapsed = started.elapsed();
    assert_problem(&reply, StatusCode::SERVICE_UNAVAILABLE, "lock-unavailable");
    assert!(
        elapsed < SHORT_TIMEOUT + Duration::from_millis(800),
        "503 after {elapsed:?}, not after the command timeout"
    );
    tokio::task::block_in_place(|| thaw.join().unwrap());

    // The acquire behind that 503 lands after the thaw, granting the key (30 s lease TTL)
    // to a token nobody saw; the engine releases it by that token, so the next request
    // gets the key within its 3 s wait instead of a 429.
    let after = server.post("/wait", &[("x-key", "k")]).await;
    assert!(after.text().starts_with("fence:"), "{}", after.text());
    assert_no_residue(&redis, &engine, prefix, &[lock_key("k")]).await;
}
