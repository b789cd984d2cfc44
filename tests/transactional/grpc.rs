//! gRPC behind the transactional layer: a real tonic client calls a real tonic server with
//! `.transactional(pool)` in front. A gRPC answer is HTTP `200` whatever happened; its
//! `grpc-status` comes in the trailers, after the messages, and decides as the
//! engine-backed layer's: a "try again" rolls the handler's rows back with no record, a
//! success commits them with its record, whose replay ends with its trailers.

use std::{
    convert::Infallible,
    future::Future,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    task::{Context, Poll},
};

use bytes::{Buf, BufMut, Bytes};
use http::uri::PathAndQuery;
use tokio::net::TcpListener;
use tonic::{
    Code, Status,
    body::Body,
    codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder},
    server::{NamedService, ServerStreamingService},
    transport::{Channel, Server},
};
use tower::Service;
use tower_lock::{idempotency::transactional::LentTransaction, sqlx};

use crate::app::{Db, MAX_STORED, shared_url};

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

/// The messages of one answer: a message, or the status that ends the stream.
type Messages = Pin<Box<dyn futures_util::Stream<Item = Result<Bytes, Status>> + Send>>;

/// The service `test.Payments`, server-streaming so that its status comes in the HTTP
/// trailers, after the head and a message: each call inserts a payment through the lent
/// transaction, then streams `paid` and ends with `fail` while runs are at most `fails`,
/// else with `OK` (the request message `big` streams a message over the layer's body
/// limit instead).
#[derive(Clone)]
struct Payments {
    schema: String,
    runs: Arc<AtomicUsize>,
    fail: Code,
    fails: usize,
}

impl NamedService for Payments {
    const NAME: &'static str = "test.Payments";
}

impl ServerStreamingService<Bytes> for Payments {
    type Response = Bytes;
    type ResponseStream = Messages;
    type Future = Pin<Box<dyn Future<Output = Result<tonic::Response<Messages>, Status>> + Send>>;

    fn call(&mut self, request: tonic::Request<Bytes>) -> Self::Future {
        let run = self.runs.fetch_add(1, Ordering::SeqCst) + 1;
        let (schema, fail, fails) = (self.schema.clone(), self.fail, self.fails);
        Box::pin(async move {
            let lent = request
                .extensions()
                .get::<LentTransaction>()
                .expect("the layer lends its transaction")
                .clone();
            let mut tx = lent.borrow().await.unwrap();
            sqlx::query(&format!(
                "INSERT INTO {schema}.payments (note) VALUES ('grpc')"
            ))
            .persistent(false)
            .execute(&mut *tx)
            .await
            .unwrap();
            drop(tx);
            let message = if request.get_ref() == "big" {
                Bytes::from(vec![b'x'; MAX_STORED * 4])
            } else {
                Bytes::from_static(b"paid")
            };
            let mut messages = vec![Ok(message)];
            if run <= fails {
                messages.push(Err(Status::new(fail, "try again")));
            }
            let mut res =
                tonic::Response::new(Box::pin(futures_util::stream::iter(messages)) as Messages);
            res.metadata_mut()
                .insert("x-run", run.to_string().parse().unwrap());
            Ok(res)
        })
    }
}

impl Service<http::Request<Body>> for Payments {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<http::Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let payments = self.clone();
        Box::pin(async move {
            Ok(tonic::server::Grpc::new(Raw)
                .server_streaming(payments, req)
                .await)
        })
    }
}

/// A tonic server for `test.Payments` on `db` (failing its first `fails` calls with
/// `fail`) behind the transactional layer, a client connected to it, and the count of
/// runs.
async fn serve(
    db: &Db,
    fail: Code,
    fails: usize,
) -> (tonic::client::Grpc<Channel>, Arc<AtomicUsize>) {
    let runs = Arc::default();
    let payments = Payments {
        schema: db.schema.clone(),
        runs: Arc::clone(&runs),
        fail,
        fails,
    };
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    tokio::spawn(
        Server::builder()
            .layer(db.layer(|b| b).await)
            .add_service(payments)
            .serve_with_incoming(incoming),
    );
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    (tonic::client::Grpc::new(channel), runs)
}

/// What a call answered: its metadata and messages, or the status it ended with.
struct Answer {
    metadata: tonic::metadata::MetadataMap,
    messages: Vec<Bytes>,
    status: Result<(), Status>,
}

/// Call `test.Payments/Pay` with idempotency key `key` and message `message`, and read
/// its stream to its status (`Err` for a status in place of a head: a trailers-only
/// answer).
async fn pay(
    client: &tonic::client::Grpc<Channel>,
    key: &str,
    message: &'static str,
) -> Result<Answer, Status> {
    let mut client = client.clone();
    client.ready().await.unwrap();
    let mut req = tonic::Request::new(Bytes::from_static(message.as_bytes()));
    req.metadata_mut()
        .insert("idempotency-key", format!("\"{key}\"").parse().unwrap());
    let res = client
        .server_streaming(req, PathAndQuery::from_static("/test.Payments/Pay"), Raw)
        .await?;
    let metadata = res.metadata().clone();
    let mut stream = res.into_inner();
    let mut messages = Vec::new();
    let status = loop {
        match stream.message().await {
            Ok(Some(message)) => messages.push(message),
            Ok(None) => break Ok(()),
            Err(status) => break Err(status),
        }
    };
    Ok(Answer {
        metadata,
        messages,
        status,
    })
}

/// A handler that wrote a row, streamed a message, then ended with a gRPC "try again"
/// (its status in the trailers): the row rolls back, nothing is recorded, and the retry
/// runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_try_again_in_the_trailers_rolls_back_its_rows_and_the_retry_runs() {
    for code in [
        Code::Unavailable,
        Code::Aborted,
        Code::ResourceExhausted,
        Code::DeadlineExceeded,
        Code::Cancelled,
    ] {
        let db = Db::new(&shared_url().await, "grpc_try_again").await;
        let (client, runs) = serve(&db, code, 1).await;
        let first = pay(&client, "p-1", "pay").await.unwrap();
        assert_eq!(
            (db.payments().await, db.records().await),
            (0, 0),
            "{code:?}: committed with its rows"
        );
        assert_eq!(first.status.unwrap_err().code(), code);
        let retry = pay(&client, "p-1", "pay").await.unwrap();
        assert_eq!(
            retry.status.map_err(|s| s.code()),
            Ok(()),
            "{code:?} was replayed"
        );
        assert_eq!(retry.metadata.get("x-run").unwrap(), "2", "{code:?}");
        assert_eq!(retry.messages, ["paid"]);
        assert_eq!(runs.load(Ordering::SeqCst), 2, "{code:?}");
        assert_eq!(
            (db.payments().await, db.records().await),
            (1, 1),
            "{code:?}"
        );
    }
}

/// A successful call commits its one row with its record; its retry is replayed, status
/// `OK` from the stored trailers, with the first run's message and metadata.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_success_commits_once_and_its_retry_is_replayed_with_its_trailers() {
    let db = Db::new(&shared_url().await, "grpc_ok").await;
    let (client, runs) = serve(&db, Code::Ok, 0).await;
    let first = pay(&client, "p-1", "pay").await.unwrap();
    first.status.unwrap();
    assert_eq!(first.metadata.get("x-run").unwrap(), "1");
    assert_eq!(first.messages, ["paid"]);
    let retry = pay(&client, "p-1", "pay").await.unwrap();
    retry.status.unwrap();
    assert_eq!(retry.metadata.get("idempotent-replayed").unwrap(), "true");
    assert_eq!(retry.metadata.get("x-run").unwrap(), "1");
    assert_eq!(retry.messages, ["paid"]);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!((db.payments().await, db.records().await), (1, 1));
}

/// Over the body limit the trailers still decide: a "try again" rolls the rows back (the
/// retry runs); a lasting status commits them with a tombstone (the retry is refused,
/// `FAILED_PRECONDITION`, a gRPC status).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_answer_over_the_body_limit_is_decided_by_its_trailers() {
    let db = Db::new(&shared_url().await, "grpc_big").await;
    let (client, runs) = serve(&db, Code::Unavailable, 1).await;
    let first = pay(&client, "p-1", "big").await.unwrap();
    assert_eq!(first.messages[0].len(), MAX_STORED * 4);
    assert_eq!(first.status.unwrap_err().code(), Code::Unavailable);
    assert_eq!((db.payments().await, db.records().await), (0, 0));
    let second = pay(&client, "p-1", "big").await.unwrap();
    assert_eq!(second.messages[0].len(), MAX_STORED * 4);
    second.status.unwrap();
    assert_eq!((db.payments().await, db.records().await), (1, 1));
    let retry = pay(&client, "p-1", "big").await.map(|a| a.status);
    let (Err(refused) | Ok(Err(refused))) = retry else {
        panic!("replayed")
    };
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}
