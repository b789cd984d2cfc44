//! Idempotency replay over real sockets: each scenario serves an app of its own under an
//! [`IdempotencyLayer`] and checks what clients see, how often the handlers ran, and what
//! the backend kept.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use axum::{
    body::Body,
    response::{IntoResponse, Response},
    routing::post,
};
use bytes::Bytes;
use http::StatusCode;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    sync::mpsc,
    time::{Instant, sleep},
};
use tower_lock::{IdempotencyLayer, IdempotencyLayerBuilder};

use tower_lock_actix::ReplayMiddleware;

use super::{ACTIX_WORKERS, Framework, Stack, idempotency_lock_key};
use crate::{
    gate::{Gate, GateControl, gate},
    http::{Reply, TestServer, channel_body, serve, serve_actix},
};

/// An app under one idempotency layer, and the handles its scenarios drive it with.
pub struct ReplayApp {
    /// The server.
    pub server: Arc<TestServer>,
    /// Handler runs, every route together.
    pub runs: Arc<AtomicUsize>,
    /// The gate `POST /slow` waits at.
    pub control: GateControl,
    /// The body senders of `POST /stream` responses, one per run.
    pub streams: mpsc::UnboundedReceiver<mpsc::Sender<Bytes>>,
}

/// The routes, all under `layer`:
/// - `POST /orders`, `POST /other`: `201` with `Location`, `ETag`, two `Link`s,
///   `Cache-Control`, `Vary`, `Content-Type`, `Set-Cookie` and `X-Run`, and a body echoing
///   the request body and the run number;
/// - `GET /orders`: `200` (not covered by the layer);
/// - `POST /fail`: `500`;
/// - `POST /slow`: waits at the gate, then `201`;
/// - `POST /stream`: `200` with a body the test feeds through [`ReplayApp::streams`];
/// - `POST /big`: `200` with a 4 KiB body.
pub async fn replay_app(on: Stack, layer: IdempotencyLayer) -> ReplayApp {
    let runs = Arc::new(AtomicUsize::new(0));
    let (gate, control) = gate();
    let gate = Arc::new(gate);
    let (streams_tx, streams) = mpsc::unbounded_channel();
    let handlers = Handlers {
        runs: runs.clone(),
        gate,
        streams: streams_tx,
    };
    let server = match on.framework {
        Framework::Tower => serve(axum_app(handlers, layer)).await,
        Framework::Actix => {
            let replay = ReplayMiddleware::from(&layer);
            serve_actix(ACTIX_WORKERS, move || {
                actix_app(handlers.clone(), replay.clone())
            })
        }
    };
    ReplayApp {
        server: Arc::new(server),
        runs,
        control,
        streams,
    }
}

/// What the handlers share: the run count, the gate, the stream senders.
#[derive(Clone)]
struct Handlers {
    runs: Arc<AtomicUsize>,
    gate: Arc<Gate>,
    streams: mpsc::UnboundedSender<mpsc::Sender<Bytes>>,
}

impl Handlers {
    fn run(&self) -> usize {
        self.runs.fetch_add(1, Ordering::SeqCst) + 1
    }

    async fn slow(&self) -> String {
        let n = self.run();
        let _inside = self.gate.pass(n.to_string()).await;
        format!("slow {n}")
    }

    fn stream(&self) -> crate::http::ChannelBody {
        self.run();
        let (tx, body) = channel_body();
        self.streams.send(tx).unwrap();
        body
    }
}

fn axum_app(h: Handlers, layer: IdempotencyLayer) -> axum::Router {
    let orders = {
        let h = h.clone();
        move |body: String| {
            let n = h.run();
            async move { created(n, &body) }
        }
    };
    let fail = {
        let h = h.clone();
        move || {
            let n = h.run();
            async move { (StatusCode::INTERNAL_SERVER_ERROR, format!("boom {n}")) }
        }
    };
    let slow = {
        let h = h.clone();
        move || {
            let h = h.clone();
            async move { (StatusCode::CREATED, h.slow().await) }
        }
    };
    let stream = {
        let h = h.clone();
        move || {
            let body = h.stream();
            async move { Response::new(Body::new(body)) }
        }
    };
    let big = {
        let h = h.clone();
        move || {
            h.run();
            async move { "x".repeat(4096) }
        }
    };
    let answer = {
        let h = h.clone();
        move |headers: http::HeaderMap| {
            let n = h.run();
            async move { answer(n, &headers) }
        }
    };
    let panic_body = {
        let h = h.clone();
        move || {
            h.run();
            async move { Response::new(Body::new(PanicBody)) }
        }
    };
    let panics = move || {
        h.run();
        async move {
            panic!("the handler panics (on purpose: a test)");
            #[allow(unreachable_code)]
            ""
        }
    };
    axum::Router::new()
        .route("/orders", post(orders.clone()).get(|| async { "list" }))
        .route("/other", post(orders))
        .route("/fail", post(fail))
        .route("/slow", post(slow))
        .route("/stream", post(stream))
        .route("/big", post(big))
        .route("/answer", post(answer))
        .route("/panic-body", post(panic_body))
        .route("/panic", post(panics))
        .layer(layer)
}

fn actix_app(
    h: Handlers,
    replay: ReplayMiddleware,
) -> actix_web::App<
    impl actix_web::dev::ServiceFactory<
        actix_web::dev::ServiceRequest,
        Config = (),
        Response = actix_web::dev::ServiceResponse<impl actix_web::body::MessageBody>,
        Error = actix_web::Error,
        InitError = (),
    >,
> {
    use actix_web::{HttpResponse, web};
    let to_actix = |res: Response| {
        let (parts, body) = res.into_parts();
        let mut out = HttpResponse::build(
            actix_web::http::StatusCode::from_u16(parts.status.as_u16()).unwrap(),
        );
        for (name, value) in &parts.headers {
            out.append_header((name.as_str(), value.as_bytes()));
        }
        (out, body)
    };
    let orders = {
        let h = h.clone();
        move |body: String| {
            let n = h.run();
            async move {
                let (mut out, _) = to_actix(created(n, &body));
                out.body(format!("{{\"order\":{n},\"echo\":{body:?}}}"))
            }
        }
    };
    let fail = {
        let h = h.clone();
        move || {
            let n = h.run();
            async move { HttpResponse::InternalServerError().body(format!("boom {n}")) }
        }
    };
    let slow = {
        let h = h.clone();
        move || {
            let h = h.clone();
            async move { HttpResponse::Created().body(h.slow().await) }
        }
    };
    let stream = {
        let h = h.clone();
        move || {
            let body = h.stream();
            async move { HttpResponse::Ok().body(body) }
        }
    };
    let big = {
        let h = h.clone();
        move || {
            h.run();
            async move { HttpResponse::Ok().body("x".repeat(4096)) }
        }
    };
    let answer = {
        let h = h.clone();
        move |req: actix_web::HttpRequest| {
            let n = h.run();
            async move {
                let mut headers = http::HeaderMap::new();
                for (name, value) in req.headers() {
                    headers.append(
                        http::HeaderName::from_bytes(name.as_str().as_bytes()).unwrap(),
                        http::HeaderValue::from_bytes(value.as_bytes()).unwrap(),
                    );
                }
                let (status, headers, body) = answer_parts(n, &headers);
                let mut out = HttpResponse::build(
                    actix_web::http::StatusCode::from_u16(status.as_u16()).unwrap(),
                );
                for (name, value) in headers {
                    out.append_header((name, value));
                }
                if req.headers().contains_key("x-not-stored") {
                    out.extensions_mut()
                        .insert(tower_lock::idempotency::NotStored);
                }
                out.body(body)
            }
        }
    };
    let panic_body = {
        let h = h.clone();
        move || {
            h.run();
            async move { HttpResponse::Ok().body(PanicBody) }
        }
    };
    let panics = {
        let h = h.clone();
        move || {
            h.run();
            async move {
                panic!("the handler panics (on purpose: a test)");
                #[allow(unreachable_code)]
                HttpResponse::Ok().finish()
            }
        }
    };
    let resource = |path: &str| web::resource(path.to_owned()).wrap(replay.clone());
    actix_web::App::new()
        .service(
            resource("/orders")
                .route(web::post().to(orders.clone()))
                .route(web::get().to(|| async { "list" })),
        )
        .service(resource("/other").route(web::post().to(orders)))
        .service(resource("/fail").route(web::post().to(fail)))
        .service(resource("/slow").route(web::post().to(slow)))
        .service(resource("/stream").route(web::post().to(stream)))
        .service(resource("/big").route(web::post().to(big)))
        .service(resource("/answer").route(web::post().to(answer)))
        .service(resource("/panic-body").route(web::post().to(panic_body)))
        .service(resource("/panic").route(web::post().to(panics)))
}

fn created(n: usize, body: &str) -> Response {
    let mut res = (
        StatusCode::CREATED,
        [
            ("location", format!("/orders/{n}")),
            ("etag", format!("\"v{n}\"")),
            ("cache-control", "no-store".to_owned()),
            ("vary", "accept".to_owned()),
            ("content-type", "application/json".to_owned()),
            ("set-cookie", format!("session={n}")),
            ("x-run", n.to_string()),
        ],
        format!("{{\"order\":{n},\"echo\":{body:?}}}"),
    )
        .into_response();
    for link in ["</orders>; rel=collection", "</orders/1>; rel=first"] {
        res.headers_mut().append("link", link.parse().unwrap());
    }
    res
}

/// What `POST /answer` answers: the status named by the request's `x-status` header
/// (`201` without one), a `Retry-After` when it has `x-retry-after`, `X-Run`, and the body
/// `answer <run>`; marked [`NotStored`](tower_lock::idempotency::NotStored) when the
/// request has `x-not-stored`.
fn answer_parts(n: usize, req: &http::HeaderMap) -> (StatusCode, Vec<(String, String)>, String) {
    let status = req
        .get("x-status")
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .and_then(|s| StatusCode::from_u16(s).ok())
        .unwrap_or(StatusCode::CREATED);
    let mut headers = vec![("x-run".to_owned(), n.to_string())];
    if let Some(after) = req.get("x-retry-after").and_then(|v| v.to_str().ok()) {
        headers.push(("retry-after".to_owned(), after.to_owned()));
    }
    (status, headers, format!("answer {n}"))
}

fn answer(n: usize, req: &http::HeaderMap) -> Response {
    let (status, headers, body) = answer_parts(n, req);
    let mut res = (status, body).into_response();
    if req.contains_key("x-not-stored") {
        res.extensions_mut()
            .insert(tower_lock::idempotency::NotStored);
    }
    for (name, value) in headers {
        res.headers_mut().insert(
            http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            value.parse().unwrap(),
        );
    }
    res
}

/// A response body that panics when it is first polled.
struct PanicBody;

impl http_body::Body for PanicBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        panic!("the response body panics (on purpose: a test)")
    }
}

impl actix_web::body::MessageBody for PanicBody {
    type Error = std::convert::Infallible;

    fn size(&self) -> actix_web::body::BodySize {
        actix_web::body::BodySize::Stream
    }

    fn poll_next(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Bytes, Self::Error>>> {
        panic!("the response body panics (on purpose: a test)")
    }
}

fn key(k: &str) -> [(&'static str, String); 1] {
    [("idempotency-key", format!("\"{k}\""))]
}

async fn post_with(server: &TestServer, path: &str, k: &str, body: &str) -> Reply {
    let [(name, value)] = key(k);
    server
        .send_body("POST", path, &[(name, value.as_str())], body.to_owned())
        .await
}

/// The preset on an anonymous endpoint: every client shares the records (the scenarios
/// that are about scope choose their own).
/// `POST path` with idempotency key `k` and no body, written on a plain TCP connection
/// (with the `Host` the test client sends, which is part of the fingerprint).
async fn raw_post(server: &TestServer, path: &str, k: &str) -> tokio::net::TcpStream {
    let request = format!(
        "POST {path} HTTP/1.1\r\nhost: {}\r\nidempotency-key: \"{k}\"\r\ncontent-length: 0\r\n\r\n",
        server.addr()
    );
    server.raw(&request).await
}

fn preset(table: &super::LockTable) -> IdempotencyLayerBuilder {
    IdempotencyLayer::builder(table.engine()).unscoped()
}

/// The preset with the drain of a body nobody reads bounded to a short time.
fn drain_bounded(builder: IdempotencyLayerBuilder) -> IdempotencyLayerBuilder {
    builder.max_drain_time(Duration::from_millis(300))
}

/// Wait (bounded) until `key` has a record: the first request's response is stored when
/// its body ends, on the server's side of the connection.
async fn until_recorded(table: &super::LockTable, k: &str) {
    let key = tower_lock::LockKey::new(idempotency_lock_key(k)).unwrap();
    let give_up = Instant::now() + Duration::from_secs(10);
    while table.engine().record(&key).await.unwrap().is_none() {
        assert!(Instant::now() < give_up, "no record for {k}");
        sleep(Duration::from_millis(2)).await;
    }
}

/// A retry after completion gets the stored status, headers and body byte for byte, with
/// `Idempotent-Replayed: true`; `Set-Cookie` and `Date` are not replayed, and the handler
/// ran once.
pub async fn a_retry_after_completion_gets_the_stored_response(on: Stack) {
    let table = on.table("replay-basic").await;
    let app = replay_app(on, preset(&table).build().unwrap()).await;
    let first = post_with(&app.server, "/orders", "o1", "{\"sku\":1}").await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(first.header("idempotent-replayed"), None);
    until_recorded(&table, "o1").await;
    let again = post_with(&app.server, "/orders", "o1", "{\"sku\":1}").await;
    assert_eq!(again.status, StatusCode::CREATED);
    assert_eq!(again.body, first.body, "byte for byte");
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    for name in [
        "location",
        "etag",
        "cache-control",
        "vary",
        "content-type",
        "x-run",
    ] {
        assert_eq!(again.header(name), first.header(name), "{name}");
    }
    let links = |r: &Reply| -> Vec<_> { r.headers.get_all("link").iter().cloned().collect() };
    assert_eq!(links(&again), links(&first));
    assert_eq!(links(&again).len(), 2);
    assert!(first.header("set-cookie").is_some());
    assert_eq!(
        again.header("set-cookie"),
        None,
        "a session is not replayed"
    );
    assert_eq!(
        again.header("content-length"),
        Some(again.body.len().to_string().as_str())
    );
    assert_eq!(app.runs.load(Ordering::SeqCst), 1, "the handler ran once");
    // Other methods pass through untouched, without a key.
    let list = app.server.send("GET", "/orders", &[]).await;
    assert_eq!(
        (list.status, list.text().as_str()),
        (StatusCode::OK, "list")
    );
    table
        .assert_only_records(&[idempotency_lock_key("o1")], 1)
        .await;
}

/// One key reused with a different body, path or query is answered `422`, and the
/// handler does not run again.
pub async fn a_reused_key_with_another_request_is_422(on: Stack) {
    let table = on.table("replay-422").await;
    let app = replay_app(on, preset(&table).build().unwrap()).await;
    let first = post_with(&app.server, "/orders?x=1", "o2", "a").await;
    assert_eq!(first.status, StatusCode::CREATED);
    until_recorded(&table, "o2").await;
    for (path, body) in [
        ("/orders?x=1", "b"),
        ("/other?x=1", "a"),
        ("/orders?x=2", "a"),
        ("/orders", "a"),
    ] {
        let reply = post_with(&app.server, path, "o2", body).await;
        assert_eq!(
            reply.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{path} {body}"
        );
        assert_eq!(
            reply.json()["type"],
            "urn:tower-lock:problem:fingerprint-mismatch"
        );
        assert_eq!(reply.header("idempotent-replayed"), None);
    }
    assert_eq!(app.runs.load(Ordering::SeqCst), 1);
    table
        .assert_only_records(&[idempotency_lock_key("o2")], 1)
        .await;
}

/// A duplicate of a request in flight is answered `409` with `Retry-After`; once the
/// first completes, the retry gets its replay.
pub async fn a_duplicate_in_flight_is_409_then_replayed(on: Stack) {
    let table = on.table("replay-409").await;
    let mut app = replay_app(on, preset(&table).build().unwrap()).await;
    let server = app.server.clone();
    let first = tokio::spawn(async move { post_with(&server, "/slow", "o3", "").await });
    assert_eq!(app.control.arrived().await, "1");
    let dup = post_with(&app.server, "/slow", "o3", "").await;
    assert_eq!(dup.status, StatusCode::CONFLICT);
    assert!(dup.header("retry-after").is_some());
    assert_eq!(dup.json()["type"], "urn:tower-lock:problem:conflict");
    app.control.open();
    let first = first.await.unwrap();
    assert_eq!(
        (first.status, first.text().as_str()),
        (StatusCode::CREATED, "slow 1")
    );
    until_recorded(&table, "o3").await;
    let retry = post_with(&app.server, "/slow", "o3", "").await;
    assert_eq!(
        (retry.status, retry.text().as_str()),
        (StatusCode::CREATED, "slow 1")
    );
    assert_eq!(app.runs.load(Ordering::SeqCst), 1);
    table
        .assert_only_records(&[idempotency_lock_key("o3")], 1)
        .await;
}

/// Twenty concurrent duplicates under a wait: the handler runs exactly once and all
/// twenty get identical bodies (nineteen of them replays).
pub async fn twenty_waiting_duplicates_run_the_handler_once(on: Stack) {
    let table = on.table("replay-20").await;
    let layer = preset(&table)
        .wait(Duration::from_secs(20))
        .fifo(true)
        .build()
        .unwrap();
    let mut app = replay_app(on, layer).await;
    let mut requests = Vec::new();
    for _ in 0..20 {
        let server = app.server.clone();
        requests.push(tokio::spawn(async move {
            post_with(&server, "/slow", "o4", "same").await
        }));
    }
    assert_eq!(app.control.arrived().await, "1");
    app.control.open();
    let mut replayed = 0;
    for r in requests {
        let reply = r.await.unwrap();
        assert_eq!(
            (reply.status, reply.text().as_str()),
            (StatusCode::CREATED, "slow 1")
        );
        replayed += usize::from(reply.header("idempotent-replayed") == Some("true"));
    }
    assert_eq!(replayed, 19);
    assert_eq!(app.runs.load(Ordering::SeqCst), 1, "exactly one run");
    assert_eq!(app.control.most_inside(), 1);
    table
        .assert_only_records(&[idempotency_lock_key("o4")], 1)
        .await;
}

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

/// A client that disconnects while its handler runs does not cancel it: the handler
/// completes once, and the retry gets the replay.
pub async fn a_client_leaving_mid_handler_still_gets_its_replay(on: Stack) {
    let table = on.table("replay-leave-handler").await;
    let mut app = replay_app(on, preset(&table).build().unwrap()).await;
    let mut stream = raw_post(&app.server, "/slow", "o6").await;
    assert_eq!(app.control.arrived().await, "1");
    match on.framework {
        // The client leaves: hyper reads the end of the stream, drops the request's future
        // and closes its side, which is what the read below waits for.
        Framework::Tower => {
            stream.shutdown().await.unwrap();
            let mut buf = [0u8; 256];
            while matches!(stream.read(&mut buf).await, Ok(n) if n > 0) {}
        }
        // actix does not notice a closed connection while the handler runs (it notices
        // when it next writes, actix-web#1313), so it never drops a running handler: the
        // client just leaves.
        Framework::Actix => drop(stream),
    }
    app.control.open();
    until_recorded(&table, "o6").await;
    let retry = post_with(&app.server, "/slow", "o6", "").await;
    assert_eq!(
        (retry.status, retry.text().as_str()),
        (StatusCode::CREATED, "slow 1")
    );
    assert_eq!(retry.header("idempotent-replayed"), Some("true"));
    assert_eq!(app.runs.load(Ordering::SeqCst), 1);
    table
        .assert_only_records(&[idempotency_lock_key("o6")], 1)
        .await;
}

/// A client that disconnects in the middle of a streaming body: the rest of the body is
/// still produced and stored in full; the retry gets all of it.
pub async fn a_client_leaving_mid_body_still_gets_the_whole_body_stored(on: Stack) {
    let table = on.table("replay-leave-body").await;
    let mut app = replay_app(on, preset(&table).build().unwrap()).await;
    let mut stream = raw_post(&app.server, "/stream", "o7").await;
    let tx = app.streams.recv().await.unwrap();
    tx.send(Bytes::from_static(b"part one;")).await.unwrap();
    // The client has the head and the first chunk, then leaves.
    let mut seen = Vec::new();
    while !String::from_utf8_lossy(&seen).contains("part one;") {
        let mut buf = [0u8; 1024];
        let n = stream.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed early");
        seen.extend_from_slice(&buf[..n]);
    }
    drop(stream);
    for part in ["part two;", "part three."] {
        tx.send(Bytes::from(part)).await.unwrap();
    }
    drop(tx);
    until_recorded(&table, "o7").await;
    let retry = post_with(&app.server, "/stream", "o7", "").await;
    assert_eq!(retry.text(), "part one;part two;part three.");
    assert_eq!(retry.header("idempotent-replayed"), Some("true"));
    assert_eq!(app.runs.load(Ordering::SeqCst), 1);
    table
        .assert_only_records(&[idempotency_lock_key("o7")], 1)
        .await;
}

/// A body streamed in several chunks is stored in full.
pub async fn a_streaming_body_is_stored_in_full(on: Stack) {
    let table = on.table("replay-stream").await;
    let mut app = replay_app(on, preset(&table).build().unwrap()).await;
    let server = app.server.clone();
    let first = tokio::spawn(async move { post_with(&server, "/stream", "o8", "").await });
    let tx = app.streams.recv().await.unwrap();
    for i in 0..50 {
        tx.send(Bytes::from(format!("chunk {i}\n"))).await.unwrap();
    }
    drop(tx);
    let first = first.await.unwrap();
    assert_eq!(first.text().lines().count(), 50);
    until_recorded(&table, "o8").await;
    let again = post_with(&app.server, "/stream", "o8", "").await;
    assert_eq!(again.body, first.body);
    assert_eq!(app.runs.load(Ordering::SeqCst), 1);
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

/// After the retention, the record is gone: the key runs again.
pub async fn records_expire_after_the_retention(on: Stack) {
    let table = on.table("replay-retention").await;
    let layer = preset(&table)
        .retention(Duration::from_millis(300))
        .build()
        .unwrap();
    let app = replay_app(on, layer).await;
    let first = post_with(&app.server, "/orders", "o10", "x").await;
    until_recorded(&table, "o10").await;
    let again = post_with(&app.server, "/orders", "o10", "x").await;
    assert_eq!(again.body, first.body);
    sleep(Duration::from_millis(400)).await;
    let later = post_with(&app.server, "/orders", "o10", "x").await;
    assert_eq!(later.header("idempotent-replayed"), None);
    assert_eq!(later.header("x-run"), Some("2"));
    sleep(Duration::from_millis(400)).await;
    table
        .assert_only_records(&[idempotency_lock_key("o10")], 0)
        .await;
}

/// Missing and malformed keys are `400`; a request body over the limit is `413`; neither
/// runs the handler nor leaves anything behind.
pub async fn bad_keys_are_400_and_oversized_requests_413(on: Stack) {
    let table = on.table("replay-bad").await;
    let layer = preset(&table).max_request_body(64).build().unwrap();
    let app = replay_app(on, layer).await;
    let missing = app.server.send_body("POST", "/orders", &[], "x").await;
    assert_eq!(missing.status, StatusCode::BAD_REQUEST);
    assert_eq!(missing.json()["type"], "urn:tower-lock:problem:missing-key");
    let long = "k".repeat(256);
    for bad in [
        "\"unterminated",
        "a\"b",
        "\"\"",
        "",
        long.as_str(),
        "\"caf\u{e9}\"",
    ] {
        let reply = app
            .server
            .send_body("POST", "/orders", &[("idempotency-key", bad)], "x")
            .await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{bad:?}");
        assert_eq!(
            reply.json()["type"],
            "urn:tower-lock:problem:malformed-key",
            "{bad:?}"
        );
    }
    let too_big = post_with(&app.server, "/orders", "o11", &"b".repeat(65)).await;
    assert_eq!(too_big.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(
        too_big.json()["type"],
        "urn:tower-lock:problem:request-too-large"
    );
    let fits = post_with(&app.server, "/orders", "o11", &"b".repeat(64)).await;
    assert_eq!(fits.status, StatusCode::CREATED);
    assert_eq!(app.runs.load(Ordering::SeqCst), 1);
    table
        .assert_only_records(&[idempotency_lock_key("o11")], 1)
        .await;
}

/// The quick-start preset (no scope chosen) never hands one caller's stored response to
/// another caller who happens to send the same key and body: `build()` refuses a preset
/// without a scope decision and names the choices.
pub async fn the_quick_start_preset_never_replays_a_response_to_another_caller(on: Stack) {
    let table = on.table("replay-callers").await;
    let built = IdempotencyLayer::builder(table.engine()).build();
    let layer = match built {
        Err(error) => {
            let text = error.to_string();
            for choice in ["per_principal", "scope_by", "unscoped"] {
                assert!(text.contains(choice), "{text:?} names {choice}");
            }
            return;
        }
        Ok(layer) => layer,
    };
    // If it builds, two callers must still never share an answer.
    let app = replay_app(on, layer).await;
    let send = |user: &'static str| {
        let server = app.server.clone();
        async move {
            server
                .send_body(
                    "POST",
                    "/orders",
                    &[
                        ("idempotency-key", "\"order-1\""),
                        ("authorization", &format!("Bearer {user}")),
                    ],
                    "{\"sku\":42}",
                )
                .await
        }
    };
    let alice = send("alice").await;
    assert_eq!(alice.status, StatusCode::CREATED);
    until_recorded(&table, "order-1").await;
    let bob = send("bob").await;
    assert_ne!(
        bob.header("idempotent-replayed"),
        Some("true"),
        "bob was handed alice's stored response: {:?}",
        bob.text()
    );
}

/// A key reused for the same path on another host name is a `422`, not a replay of the
/// other host's response.
pub async fn a_key_reused_on_another_host_is_422(on: Stack) {
    let table = on.table("replay-host").await;
    let app = replay_app(on, preset(&table).build().unwrap()).await;
    let send = |host: &'static str| {
        let server = app.server.clone();
        async move {
            server
                .send_body(
                    "POST",
                    "/orders",
                    &[("idempotency-key", "\"h1\""), ("host", host)],
                    "same",
                )
                .await
        }
    };
    let first = send("tenant-1.example").await;
    assert_eq!(first.status, StatusCode::CREATED);
    until_recorded(&table, "h1").await;
    let same_host = send("tenant-1.example").await;
    assert_eq!(same_host.header("idempotent-replayed"), Some("true"));
    let other = send("tenant-2.example").await;
    assert_eq!(
        other.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "another host was answered {} {:?}",
        other.status,
        other.text()
    );
    assert_eq!(app.runs.load(Ordering::SeqCst), 1);
}

/// Every value of a fingerprinted header counts, in order: a retry that differs only in
/// a second value is a `422`.
pub async fn every_value_of_a_fingerprinted_header_counts(on: Stack) {
    let table = on.table("replay-values").await;
    let layer = preset(&table)
        .fingerprint_headers([http::HeaderName::from_static("x-scope")])
        .build()
        .unwrap();
    let app = replay_app(on, layer).await;
    let send = |second: &'static str| {
        let server = app.server.clone();
        async move {
            server
                .send_body(
                    "POST",
                    "/orders",
                    &[
                        ("idempotency-key", "\"v1\""),
                        ("x-scope", "read"),
                        ("x-scope", second),
                    ],
                    "same",
                )
                .await
        }
    };
    assert_eq!(send("write").await.status, StatusCode::CREATED);
    until_recorded(&table, "v1").await;
    assert_eq!(
        send("write").await.header("idempotent-replayed"),
        Some("true")
    );
    let other = send("admin").await;
    assert_eq!(
        other.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "a different second value was answered {} {:?}",
        other.status,
        other.text()
    );
    assert_eq!(app.runs.load(Ordering::SeqCst), 1);
}

/// An answer that means "this did not happen, try again" is never stored: `408`, `409`,
/// `423`, `425`, `429`, `5xx`, anything with `Retry-After`, and by default `400`, `401`,
/// `403`, `407`, `413`, `415`, `422`; nor is a framework extractor's rejection. The retry
/// runs the handler again.
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
        ("202", Some("10")),
        ("200", Some("3")),
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

/// A response body that panics, or a handler that panics, costs only its own request:
/// the server keeps serving, nothing is stored, and the key is released at once.
pub async fn a_panicking_body_or_handler_costs_only_its_own_request(on: Stack) {
    let table = on.table("replay-panic").await;
    let app = replay_app(on, preset(&table).build().unwrap()).await;
    for (path, k) in [("/panic-body", "p1"), ("/panic", "p2")] {
        let mut stream = raw_post(&app.server, path, k).await;
        // Whatever the server manages to send, the connection ends.
        let mut buf = [0u8; 1024];
        while matches!(
            tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buf)).await,
            Ok(Ok(n)) if n > 0
        ) {}
        // The server is alive and serves the next request.
        let next = post_with(&app.server, "/orders", &format!("after-{k}"), "x").await;
        assert_eq!(next.status, StatusCode::CREATED, "after {path}");
    }
    let mut keys: Vec<String> = ["p1", "p2"]
        .iter()
        .map(|k| idempotency_lock_key(k))
        .collect();
    // Nothing stored for the panicking requests (their keys are free within 5 s, not a
    // lease TTL); the two requests after them are.
    keys.extend(
        ["after-p1", "after-p2"]
            .iter()
            .map(|k| idempotency_lock_key(k)),
    );
    table.assert_only_records(&keys, 2).await;
    for k in ["p1", "p2"] {
        let key = tower_lock::LockKey::new(idempotency_lock_key(k)).unwrap();
        assert!(table.engine().record(&key).await.unwrap().is_none(), "{k}");
    }
}

/// A response body that never ends after its client left (a stream answering a keyed
/// `POST`) is drained for a bounded time only: then the request is recorded as completed
/// but not stored (a retry is `409 response-not-stored`, never a second run), and the key
/// is released.
pub async fn an_endless_body_after_its_client_left_is_cut_off(on: Stack) {
    let table = on.table("replay-endless").await;
    let layer = drain_bounded(preset(&table)).build().unwrap();
    let mut app = replay_app(on, layer).await;
    let mut stream = raw_post(&app.server, "/stream", "e1").await;
    let tx = app.streams.recv().await.unwrap();
    tx.send(Bytes::from_static(b"event 1\n")).await.unwrap();
    let mut seen = Vec::new();
    while !String::from_utf8_lossy(&seen).contains("event 1") {
        let mut buf = [0u8; 1024];
        let n = stream.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed early");
        seen.extend_from_slice(&buf[..n]);
    }
    drop(stream);
    // The stream goes on, an event every 50 ms, but nobody reads it any more. (actix
    // notices a client that left only when it next writes, actix-web#1313: the events
    // are what let it notice.)
    let events = tokio::spawn(async move {
        for n in 2.. {
            if tx.send(Bytes::from(format!("event {n}\n"))).await.is_err() {
                break;
            }
            sleep(Duration::from_millis(50)).await;
        }
    });
    until_recorded(&table, "e1").await;
    let retry = post_with(&app.server, "/stream", "e1", "").await;
    assert_eq!(retry.status, StatusCode::CONFLICT);
    assert_eq!(
        retry.json()["type"],
        "urn:tower-lock:problem:response-not-stored"
    );
    assert_eq!(app.runs.load(Ordering::SeqCst), 1);
    table
        .assert_only_records(&[idempotency_lock_key("e1")], 1)
        .await;
    events.abort();
}

/// Inside axum's nested routers the record is bound to the full original target: a key
/// reused on `/v2/orders` after `/v1/orders`, or by tenant 2 after tenant 1 under
/// `/tenants/{tenant}`, is a `422`, never the other route's stored response. (Tower only:
/// actix sees the full path already, which the host and path scenarios cover.)
pub async fn nested_routers_bind_records_to_the_full_target(backend: super::Backend) {
    let on = Stack::new(Framework::Tower, backend);
    let table = on.table("replay-nested").await;
    let runs = Arc::new(AtomicUsize::new(0));
    let orders = {
        let runs = runs.clone();
        move |body: String| {
            let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
            async move { created(n, &body) }
        }
    };
    let inner = axum::Router::new()
        .route("/orders", post(orders))
        .layer(preset(&table).build().unwrap());
    let app = axum::Router::new()
        .nest("/v1", inner.clone())
        .nest("/v2", inner.clone())
        .nest("/tenants/{tenant}", inner);
    let server = serve(app).await;
    for (first, second, k) in [
        ("/v1/orders", "/v2/orders", "n1"),
        ("/tenants/1/orders", "/tenants/2/orders", "n2"),
    ] {
        let one = post_with(&server, first, k, "same").await;
        assert_eq!(one.status, StatusCode::CREATED, "{first}");
        until_recorded(&table, k).await;
        let again = post_with(&server, first, k, "same").await;
        assert_eq!(again.header("idempotent-replayed"), Some("true"), "{first}");
        let other = post_with(&server, second, k, "same").await;
        assert_eq!(
            other.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{second} after {first} was answered {} {:?}",
            other.status,
            other.text()
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// A scoped preset replays a stored response only to the caller who made it: another
/// caller sending the same key and body runs its own request, and each caller's retries
/// get their own response.
pub async fn a_scoped_preset_replays_only_to_the_caller_who_made_it(on: Stack) {
    let table = on.table("replay-scoped").await;
    // The scope a server derives: here the bearer token stands for a verified identity.
    let layer = IdempotencyLayer::builder(table.engine())
        .scope_by(|req: &dyn tower_lock::key::RequestView| {
            let token = req.header("authorization")?.strip_prefix(b"Bearer ")?;
            Some(String::from_utf8_lossy(token).into_owned())
        })
        .build()
        .unwrap();
    let app = replay_app(on, layer).await;
    let send = |user: &'static str| {
        let server = app.server.clone();
        async move {
            let bearer = format!("Bearer {user}");
            server
                .send_body(
                    "POST",
                    "/orders",
                    &[
                        ("idempotency-key", "\"order-1\""),
                        ("authorization", bearer.as_str()),
                    ],
                    "{\"sku\":42}",
                )
                .await
        }
    };
    let alice = send("alice").await;
    assert_eq!(alice.header("x-run"), Some("1"));
    let bob = send("bob").await;
    assert_eq!(
        (
            bob.status,
            bob.header("idempotent-replayed"),
            bob.header("x-run")
        ),
        (StatusCode::CREATED, None, Some("2")),
        "bob runs his own order"
    );
    for (user, run) in [("alice", "1"), ("bob", "2")] {
        let again = send(user).await;
        assert_eq!(again.header("idempotent-replayed"), Some("true"), "{user}");
        assert_eq!(again.header("x-run"), Some(run), "{user} gets their own");
    }
    // Without a scope there is no key.
    let anonymous = post_with(&app.server, "/orders", "order-1", "{\"sku\":42}").await;
    assert_eq!(anonymous.status, StatusCode::BAD_REQUEST);
    assert_eq!(app.runs.load(Ordering::SeqCst), 2);
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

/// What peers' users ask for: the key in `X-Idempotency-Key`, a hook that adjusts replayed
/// responses, a canonical JSON fingerprint (`{"a":1, "b":2}` and `{"b":2,"a":1}` are one
/// request), and an operator's look at and removal of one stored record.
pub async fn a_custom_key_header_replay_hook_canonical_json_and_record_removal(on: Stack) {
    let table = on.table("replay-peers").await;
    let layer = preset(&table)
        .key_header(http::HeaderName::from_static("x-idempotency-key"))
        .canonical_json()
        .on_replay(|res: &mut http::Response<Bytes>| {
            res.headers_mut()
                .insert("x-replay-hook", http::HeaderValue::from_static("1"));
        })
        .build()
        .unwrap();
    let replay = layer.replay_locker().clone();
    let app = replay_app(on, layer).await;
    let send = |body: &'static str| {
        let server = app.server.clone();
        async move {
            server
                .send_body(
                    "POST",
                    "/orders",
                    &[
                        ("x-idempotency-key", "\"c1\""),
                        ("content-type", "application/json"),
                    ],
                    body,
                )
                .await
        }
    };
    let first = send(r#"{"a":1, "b":[1,2]}"#).await;
    assert_eq!(first.status, StatusCode::CREATED);
    let key = replay
        .record_key(None, "c1")
        .expect("an unscoped layer's key");
    let give_up = Instant::now() + Duration::from_secs(10);
    while table.engine().record(&key).await.unwrap().is_none() {
        assert!(Instant::now() < give_up, "no record");
        sleep(Duration::from_millis(2)).await;
    }
    let same = send(r#"{ "b": [1, 2], "a": 1 }"#).await;
    assert_eq!(same.header("idempotent-replayed"), Some("true"));
    assert_eq!(same.header("x-replay-hook"), Some("1"));
    assert_eq!(same.body, first.body);
    let other = send(r#"{"a":1, "b":[2,1]}"#).await;
    assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY);
    // The old header is not the key any more.
    let old = post_with(&app.server, "/orders", "c1", "{}").await;
    assert_eq!(old.status, StatusCode::BAD_REQUEST);
    // An operator removes the record: the key runs again.
    assert!(
        replay.record_key(Some("someone"), "c1").is_none(),
        "unscoped"
    );
    assert!(table.engine().forget_record(&key).await.unwrap());
    assert!(table.engine().record(&key).await.unwrap().is_none());
    let again = send(r#"{"a":1,"b":[1,2]}"#).await;
    assert_eq!(again.header("idempotent-replayed"), None);
    assert_eq!(app.runs.load(Ordering::SeqCst), 2);
}

/// Instantiate the replay scenarios on one framework and one backend.
#[macro_export]
macro_rules! replay_scenarios {
    (framework = $framework:ident, backend = $backend:ident $(,)?) => {
        $crate::replay_scenarios!(@cases $framework $backend;
            a_retry_after_completion_gets_the_stored_response,
            a_reused_key_with_another_request_is_422,
            a_duplicate_in_flight_is_409_then_replayed,
            twenty_waiting_duplicates_run_the_handler_once,
            server_errors_are_not_stored_unless_asked,
            a_client_leaving_mid_handler_still_gets_its_replay,
            a_client_leaving_mid_body_still_gets_the_whole_body_stored,
            a_streaming_body_is_stored_in_full,
            an_oversized_response_is_not_replayed_nor_run_again,
            records_expire_after_the_retention,
            bad_keys_are_400_and_oversized_requests_413,
            the_quick_start_preset_never_replays_a_response_to_another_caller,
            a_key_reused_on_another_host_is_422,
            every_value_of_a_fingerprinted_header_counts,
            answers_that_mean_try_again_are_never_stored,
            a_panicking_body_or_handler_costs_only_its_own_request,
            an_endless_body_after_its_client_left_is_cut_off,
            a_scoped_preset_replays_only_to_the_caller_who_made_it,
            the_application_decides_what_else_is_stored,
            a_custom_key_header_replay_hook_canonical_json_and_record_removal,
        );
    };
    (@cases $framework:ident $backend:ident; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let stack = $crate::scenarios::Stack::new(
                    $crate::scenarios::Framework::$framework,
                    $crate::scenarios::Backend::$backend,
                );
                $crate::scenarios::bounded($crate::scenarios::$case(stack)).await;
            }
        )*
    };
}
