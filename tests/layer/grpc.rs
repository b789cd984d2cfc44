//! gRPC callers get gRPC answers: a real tonic client calls a real tonic server with the
//! lock layer in front, and each rejection arrives as a gRPC status (`ABORTED`,
//! `RESOURCE_EXHAUSTED`, `UNAVAILABLE`, `INVALID_ARGUMENT`) with the retry hint in its
//! metadata, not as an HTTP error the client can only report as `UNKNOWN`.

use std::{
    convert::Infallible,
    future::Future,
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};

use bytes::{Buf, BufMut, Bytes};
use http::uri::PathAndQuery;
use tokio::net::TcpListener;
use tonic::{
    Code, Status,
    body::Body,
    codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder},
    server::{NamedService, UnaryService},
    transport::{Channel, Server},
};
use tower::Service;
use tower_lock::{LockEngine, LockLayer, key::HeaderKey};
use tower_lock_test_support::{
    gate::{Gate, GateControl, gate},
    unavailable::UnavailableBackend,
};

/// Messages as raw bytes: no protobuf code generation for a test.
#[derive(Clone, Copy, Default)]
struct Raw;

impl Codec for Raw {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = Self;
    type Decoder = Self;

    fn encoder(&mut self) -> Self {
        Self
    }

    fn decoder(&mut self) -> Self {
        Self
    }
}

impl Encoder for Raw {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(item);
        Ok(())
    }
}

impl Decoder for Raw {
    type Item = Bytes;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

/// The service `test.Jobs`: its one method waits at the gate, then answers `done`.
#[derive(Clone)]
struct Jobs(Gate);

impl NamedService for Jobs {
    const NAME: &'static str = "test.Jobs";
}

impl UnaryService<Bytes> for Jobs {
    type Response = Bytes;
    type Future = Pin<Box<dyn Future<Output = Result<tonic::Response<Bytes>, Status>> + Send>>;

    fn call(&mut self, _request: tonic::Request<Bytes>) -> Self::Future {
        let gate = self.0.clone();
        Box::pin(async move {
            let _inside = gate.pass("run".to_owned()).await;
            Ok(tonic::Response::new(Bytes::from_static(b"done")))
        })
    }
}

impl Service<http::Request<Body>> for Jobs {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<http::Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let jobs = self.clone();
        Box::pin(async move { Ok(tonic::server::Grpc::new(Raw).unary(jobs, req).await) })
    }
}

/// A tonic server for `test.Jobs` behind `layer`, and a client connected to it.
async fn serve(layer: LockLayer) -> (tonic::client::Grpc<Channel>, GateControl) {
    let (gate, control) = gate();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    tokio::spawn(
        Server::builder()
            .layer(layer)
            .add_service(Jobs(gate))
            .serve_with_incoming(incoming),
    );
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    (tonic::client::Grpc::new(channel), control)
}

/// Call `test.Jobs/Run`, with `tenant` in the metadata when given.
async fn run(
    client: &tonic::client::Grpc<Channel>,
    tenant: Option<&str>,
) -> Result<tonic::Response<Bytes>, Status> {
    let mut client = client.clone();
    client.ready().await.unwrap();
    let mut req = tonic::Request::new(Bytes::from_static(b"job"));
    if let Some(tenant) = tenant {
        req.metadata_mut()
            .insert("x-tenant-id", tenant.parse().unwrap());
    }
    client
        .unary(req, PathAndQuery::from_static("/test.Jobs/Run"), Raw)
        .await
}

fn tenant_layer(engine: LockEngine) -> tower_lock::LockLayerBuilder {
    LockLayer::builder(engine).key(HeaderKey::new("x-tenant-id"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_key_is_aborted_with_the_retry_hint_in_metadata() {
    let (client, mut control) = serve(tenant_layer(LockEngine::in_memory()).build().unwrap()).await;
    let held = run(&client, Some("acme"));
    let others = async {
        control.arrived().await;
        let status = run(&client, Some("acme")).await.unwrap_err();
        assert_eq!(status.code(), Code::Aborted, "{status:?}");
        assert!(status.message().contains("holds the lock"), "{status:?}");
        let metadata = status.metadata();
        assert_eq!(metadata.get("retry-after").unwrap(), "1");
        assert_eq!(metadata.get("grpc-retry-pushback-ms").unwrap(), "1000");
        // Another tenant runs.
        let other = run(&client, Some("globex"));
        let open = async {
            control.arrived().await;
            control.open();
        };
        let (other, ()) = tokio::join!(other, open);
        assert_eq!(other.unwrap().into_inner(), "done");
    };
    let (held, ()) = tokio::join!(held, others);
    assert_eq!(held.unwrap().into_inner(), "done");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_that_runs_out_is_resource_exhausted() {
    let layer = tenant_layer(LockEngine::in_memory())
        .wait(Duration::from_millis(50))
        .build()
        .unwrap();
    let (client, mut control) = serve(layer).await;
    let held = run(&client, Some("acme"));
    let others = async {
        control.arrived().await;
        let status = run(&client, Some("acme")).await.unwrap_err();
        assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
        assert!(status.metadata().get("retry-after").is_some());
        control.open();
    };
    let (held, ()) = tokio::join!(held, others);
    assert!(held.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_key_is_an_invalid_argument_and_a_backend_failure_unavailable() {
    let (client, _control) = serve(tenant_layer(LockEngine::in_memory()).build().unwrap()).await;
    let status = run(&client, None).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("x-tenant-id"), "{status:?}");

    let down = LockEngine::new(UnavailableBackend);
    let (client, _control) = serve(tenant_layer(down).build().unwrap()).await;
    let status = run(&client, Some("acme")).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert_eq!(status.metadata().get("retry-after").unwrap(), "1");
}

/// The service `test.Orders`: each call counts a run, and fails with `fail` while runs are
/// at most `fails`; then it answers `created`.
#[derive(Clone)]
struct Orders {
    runs: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    fail: Code,
    fails: usize,
}

impl NamedService for Orders {
    const NAME: &'static str = "test.Orders";
}

impl UnaryService<Bytes> for Orders {
    type Response = Bytes;
    type Future = Pin<Box<dyn Future<Output = Result<tonic::Response<Bytes>, Status>> + Send>>;

    fn call(&mut self, _request: tonic::Request<Bytes>) -> Self::Future {
        let run = self.runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        let (fail, fails) = (self.fail, self.fails);
        Box::pin(async move {
            if run <= fails {
                return Err(Status::new(fail, "try again"));
            }
            Ok(tonic::Response::new(Bytes::from_static(b"created")))
        })
    }
}

impl Service<http::Request<Body>> for Orders {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<http::Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let orders = self.clone();
        Box::pin(async move { Ok(tonic::server::Grpc::new(Raw).unary(orders, req).await) })
    }
}

/// A tonic server for `test.Orders` (failing its first `fails` calls with `fail`) behind an
/// unscoped idempotency layer, a client connected to it, and the count of runs.
async fn serve_orders(
    fail: Code,
    fails: usize,
) -> (
    tonic::client::Grpc<Channel>,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
) {
    let layer = tower_lock::IdempotencyLayer::builder(LockEngine::in_memory())
        .unscoped()
        .build()
        .unwrap();
    serve_orders_behind(layer, fail, fails).await
}

/// [`serve_orders`] behind `layer`.
async fn serve_orders_behind(
    layer: tower_lock::IdempotencyLayer,
    fail: Code,
    fails: usize,
) -> (
    tonic::client::Grpc<Channel>,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
) {
    let runs = std::sync::Arc::default();
    let orders = Orders {
        runs: std::sync::Arc::clone(&runs),
        fail,
        fails,
    };
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    tokio::spawn(
        Server::builder()
            .layer(layer)
            .add_service(orders)
            .serve_with_incoming(incoming),
    );
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    (tonic::client::Grpc::new(channel), runs)
}

/// Call `test.Orders/Create` with idempotency key `key`.
async fn create(
    client: &tonic::client::Grpc<Channel>,
    key: &str,
) -> Result<tonic::Response<Bytes>, Status> {
    let mut client = client.clone();
    client.ready().await.unwrap();
    let mut req = tonic::Request::new(Bytes::from_static(b"order"));
    req.metadata_mut()
        .insert("idempotency-key", format!("\"{key}\"").parse().unwrap());
    client
        .unary(req, PathAndQuery::from_static("/test.Orders/Create"), Raw)
        .await
}

/// A gRPC "try again" (HTTP `200`, `grpc-status` `UNAVAILABLE`, `ABORTED`,
/// `RESOURCE_EXHAUSTED`, `DEADLINE_EXCEEDED`) is not stored: the retry runs the call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_try_again_is_not_stored_and_the_retry_runs() {
    for code in [
        Code::Unavailable,
        Code::Aborted,
        Code::ResourceExhausted,
        Code::DeadlineExceeded,
    ] {
        let (client, runs) = serve_orders(code, 1).await;
        let first = create(&client, "o-1").await.unwrap_err();
        assert_eq!(first.code(), code, "{first:?}");
        let retry = create(&client, "o-1").await;
        assert_eq!(
            retry.map(tonic::Response::into_inner).map_err(|s| s.code()),
            Ok(Bytes::from_static(b"created")),
            "{code:?} was replayed"
        );
        assert_eq!(
            runs.load(std::sync::atomic::Ordering::SeqCst),
            2,
            "{code:?}"
        );
    }
}

/// A successful gRPC call is stored, its trailers with it, and its retry is answered by
/// the replay: the same message and status, without running the call again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_successful_grpc_call_is_replayed_with_its_trailers() {
    let (client, runs) = serve_orders(Code::Ok, 0).await;
    let first = create(&client, "o-2").await.unwrap();
    assert_eq!(first.into_inner(), "created");
    let retry = create(&client, "o-2").await.unwrap();
    assert_eq!(retry.metadata().get("idempotent-replayed").unwrap(), "true");
    assert_eq!(retry.into_inner(), "created");
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 1);
}

/// A lasting gRPC answer in a trailers-only response (`NOT_FOUND`) is stored and replayed
/// as one; a request the service could not process (`INVALID_ARGUMENT`, as a `400`) is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lasting_grpc_failure_is_replayed_and_an_invalid_argument_runs_again() {
    let (client, runs) = serve_orders(Code::NotFound, usize::MAX).await;
    for _ in 0..2 {
        let status = create(&client, "o-4").await.unwrap_err();
        assert_eq!(status.code(), Code::NotFound, "{status:?}");
    }
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 1);
    let (client, runs) = serve_orders(Code::InvalidArgument, usize::MAX).await;
    for _ in 0..2 {
        let status = create(&client, "o-5").await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    }
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 2);
}

/// A layer scoped per host, as `fingerprint_authority`'s docs recommend, over HTTP/2 (every
/// gRPC call: `:authority`, no `Host` header): the call runs, scoped by its authority,
/// rather than being refused for a missing key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_per_host_scope_reads_the_authority_of_an_http2_call() {
    let layer = tower_lock::IdempotencyLayer::builder(LockEngine::in_memory())
        .scope_by(tower_lock::key::AuthorityKey::new())
        .build()
        .unwrap();
    let (client, runs) = serve_orders_behind(layer, Code::Ok, 0).await;
    let first = create(&client, "o-3").await;
    assert!(first.is_ok(), "{first:?}");
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 1);
}

/// How the first call of `test.Feed/List` ends after its messages.
#[derive(Clone, Copy)]
enum FeedEnd {
    /// With this status, in the trailers.
    Status(Code),
    /// Never: the stream stays open (only a client that leaves ends the call).
    Never,
}

/// The service `test.Feed`: each call counts a run. The first streams `messages` messages
/// of 1 KiB, then ends as `end` says; later calls stream one message, `created`, and end
/// with `OK`.
#[derive(Clone)]
struct Feed {
    runs: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    messages: usize,
    end: FeedEnd,
}

type FeedStream = Pin<Box<dyn futures_util::Stream<Item = Result<Bytes, Status>> + Send>>;

impl NamedService for Feed {
    const NAME: &'static str = "test.Feed";
}

impl tonic::server::ServerStreamingService<Bytes> for Feed {
    type Response = Bytes;
    type ResponseStream = FeedStream;
    type Future = Pin<Box<dyn Future<Output = Result<tonic::Response<FeedStream>, Status>> + Send>>;

    fn call(&mut self, _request: tonic::Request<Bytes>) -> Self::Future {
        use futures_util::StreamExt as _;
        let run = self.runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        let stream: FeedStream =
            if run > 1 {
                Box::pin(futures_util::stream::iter([Ok(Bytes::from_static(
                    b"created",
                ))]))
            } else {
                let messages = futures_util::stream::iter(
                    (0..self.messages).map(|_| Ok(Bytes::from(vec![b'm'; 1024]))),
                );
                match self.end {
                    FeedEnd::Status(code) => Box::pin(messages.chain(futures_util::stream::iter(
                        [Err(Status::new(code, "try again"))],
                    ))),
                    FeedEnd::Never => Box::pin(messages.chain(futures_util::stream::pending())),
                }
            };
        Box::pin(async move { Ok(tonic::Response::new(stream)) })
    }
}

impl Service<http::Request<Body>> for Feed {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<http::Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let feed = self.clone();
        Box::pin(async move {
            Ok(tonic::server::Grpc::new(Raw)
                .server_streaming(feed, req)
                .await)
        })
    }
}

/// A tonic server for `feed` behind an unscoped idempotency layer that stores at most
/// 2 KiB of a response body, drains a left response for at most 100 ms, and lets a
/// duplicate wait for the key; and a client connected to it.
async fn serve_feed(feed: Feed) -> tonic::client::Grpc<Channel> {
    let layer = tower_lock::IdempotencyLayer::builder(LockEngine::in_memory())
        .unscoped()
        .max_response_body(2048)
        .max_drain_time(Duration::from_millis(100))
        .wait(Duration::from_secs(10))
        .build()
        .unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    tokio::spawn(
        Server::builder()
            .layer(layer)
            .add_service(feed)
            .serve_with_incoming(incoming),
    );
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    tonic::client::Grpc::new(channel)
}

/// Call `test.Feed/List` with idempotency key `key`: its stream of messages.
async fn list(
    client: &tonic::client::Grpc<Channel>,
    key: &str,
) -> Result<tonic::Response<tonic::codec::Streaming<Bytes>>, Status> {
    let mut client = client.clone();
    client.ready().await.unwrap();
    let mut req = tonic::Request::new(Bytes::from_static(b"list"));
    req.metadata_mut()
        .insert("idempotency-key", format!("\"{key}\"").parse().unwrap());
    client
        .server_streaming(req, PathAndQuery::from_static("/test.Feed/List"), Raw)
        .await
}

/// Every message of a stream, and the status it ended with.
async fn read_all(
    stream: Result<tonic::Response<tonic::codec::Streaming<Bytes>>, Status>,
) -> (usize, Result<(), Code>) {
    let mut stream = match stream {
        Ok(stream) => stream.into_inner(),
        Err(status) => return (0, Err(status.code())),
    };
    let mut bytes = 0;
    loop {
        match stream.message().await {
            Ok(Some(message)) => bytes += message.len(),
            Ok(None) => return (bytes, Ok(())),
            Err(status) => return (bytes, Err(status.code())),
        }
    }
}

/// A server-streaming call whose messages pass the layer's `max_response_body` and that
/// then ends with a "try again" status in its trailers is not recorded at all (as a `503`
/// is not): its retry runs the handler again, rather than being answered "completed, not
/// stored" for the whole retention. A lasting status over the limit still is recorded as
/// completed, not stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_try_again_past_the_body_limit_is_not_recorded_and_the_retry_runs() {
    for code in [
        Code::Unavailable,
        Code::Aborted,
        Code::ResourceExhausted,
        Code::DeadlineExceeded,
        Code::Cancelled,
    ] {
        let runs = std::sync::Arc::default();
        let client = serve_feed(Feed {
            runs: std::sync::Arc::clone(&runs),
            messages: 4,
            end: FeedEnd::Status(code),
        })
        .await;
        let first = read_all(list(&client, "l-1").await).await;
        assert_eq!(first, (4096, Err(code)), "{code:?}");
        let retry = read_all(list(&client, "l-1").await).await;
        assert_eq!(retry, (7, Ok(())), "{code:?}: the retry did not run");
        assert_eq!(
            runs.load(std::sync::atomic::Ordering::SeqCst),
            2,
            "{code:?}"
        );
    }
    // A lasting answer over the limit: completed, not stored; the retry does not run.
    let runs = std::sync::Arc::default();
    let client = serve_feed(Feed {
        runs: std::sync::Arc::clone(&runs),
        messages: 4,
        end: FeedEnd::Status(Code::NotFound),
    })
    .await;
    let first = read_all(list(&client, "l-2").await).await;
    assert_eq!(first, (4096, Err(Code::NotFound)));
    let retry = read_all(list(&client, "l-2").await).await;
    assert_eq!(retry.0, 0, "{retry:?}");
    assert!(retry.1.is_err(), "{retry:?}");
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 1);
}

/// A server-streaming call whose client leaves and whose stream then does not end within
/// the drain time has no status (a gRPC status comes in the trailers, and HTTP `200` says
/// nothing): it is not recorded, and the retry runs the handler again, whether the
/// messages sent so far fit the body limit or not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_stream_cut_off_before_its_status_is_not_recorded_and_the_retry_runs() {
    for messages in [1, 4] {
        let runs = std::sync::Arc::default();
        let client = serve_feed(Feed {
            runs: std::sync::Arc::clone(&runs),
            messages,
            end: FeedEnd::Never,
        })
        .await;
        let mut first = list(&client, "l-3").await.unwrap().into_inner();
        assert!(first.message().await.unwrap().is_some());
        // The client leaves; the drain is cut off after 100 ms, and the duplicate waits.
        drop(first);
        let retry = read_all(list(&client, "l-3").await).await;
        assert_eq!(
            retry,
            (7, Ok(())),
            "{messages} messages: the retry did not run"
        );
        assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 2);
    }
}
