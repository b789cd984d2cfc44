//! HTTP fixtures: a test app on a real loopback socket, a client, a streaming body fed
//! from a channel, and a backend that is always unavailable.

use std::{
    net::SocketAddr,
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};

use axum::serve::ListenerExt;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::TokioExecutor,
};
use tokio::{net::TcpListener, sync::mpsc, task::JoinHandle};
use tower_lock::engine::{
    AcquireRequest, Backend, BoxFuture, ExtendMode, Grant, Holder, LockKey, Renewal,
};
use tower_lock::{BackendError, BackendErrorKind, LockError, Token};

/// An app served on 127.0.0.1 on a free port, stopped when dropped.
pub struct TestServer {
    addr: SocketAddr,
    task: JoinHandle<()>,
    client: Client<HttpConnector, Full<Bytes>>,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Serve `app` on a real socket.
pub async fn serve(app: axum::Router) -> TestServer {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    // No Nagle on either side: small streamed chunks would otherwise wait for delayed ACKs
    // and every test would measure TCP, not the layer.
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let task = tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client = Client::builder(TokioExecutor::new()).build(connector);
    TestServer { addr, task, client }
}

/// A collected response.
#[derive(Debug)]
pub struct Reply {
    pub status: http::StatusCode,
    pub headers: http::HeaderMap,
    pub body: Bytes,
}

impl Reply {
    /// The body as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "body is not JSON ({e}): {:?}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// A header as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }
}

impl TestServer {
    /// The server's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A request builder for `path` on this server.
    pub fn request(&self, method: &str, path: &str) -> http::request::Builder {
        http::Request::builder()
            .method(method)
            .uri(format!("http://{}{}", self.addr, path))
    }

    /// Send `req` and return the response with its body still streaming.
    pub async fn send_streaming(
        &self,
        req: http::request::Builder,
    ) -> http::Response<hyper::body::Incoming> {
        let req = req.body(Full::new(Bytes::new())).unwrap();
        tokio::time::timeout(Duration::from_secs(20), self.client.request(req))
            .await
            .expect("response head within 20 s")
            .expect("request succeeds")
    }

    /// Send `req` and collect the whole response.
    pub async fn send(&self, req: http::request::Builder) -> Reply {
        let res = self.send_streaming(req).await;
        let (parts, body) = res.into_parts();
        let body = tokio::time::timeout(Duration::from_secs(20), body.collect())
            .await
            .expect("response body within 20 s")
            .expect("body reads")
            .to_bytes();
        Reply {
            status: parts.status,
            headers: parts.headers,
            body,
        }
    }

    /// `POST path` with `headers`, collected.
    pub async fn post(&self, path: &str, headers: &[(&str, &str)]) -> Reply {
        let mut req = self.request("POST", path);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        self.send(req).await
    }
}

/// A response body whose frames are sent through a channel; it ends when the sender is
/// dropped.
pub struct ChannelBody {
    rx: mpsc::Receiver<Bytes>,
}

/// A channel body and its sender.
pub fn channel_body() -> (mpsc::Sender<Bytes>, ChannelBody) {
    let (tx, rx) = mpsc::channel(8);
    (tx, ChannelBody { rx })
}

impl http_body::Body for ChannelBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        self.rx
            .poll_recv(cx)
            .map(|chunk| chunk.map(|b| Ok(http_body::Frame::data(b))))
    }
}

/// A backend that cannot be reached: every call fails with `Unavailable`, at once.
#[derive(Debug, Default)]
pub struct UnavailableBackend;

fn down<T>() -> Result<T, LockError> {
    Err(LockError::Backend(BackendError::new(
        BackendErrorKind::Unavailable,
        "connection refused (test backend)",
    )))
}

impl Backend for UnavailableBackend {
    fn acquire(&self, _req: AcquireRequest) -> BoxFuture<'_, Result<Grant, LockError>> {
        Box::pin(async { down() })
    }

    fn release<'a>(
        &'a self,
        _key: &'a LockKey,
        _token: &'a Token,
    ) -> BoxFuture<'a, Result<(), LockError>> {
        Box::pin(async { down() })
    }

    fn extend<'a>(
        &'a self,
        _key: &'a LockKey,
        _token: &'a Token,
        _ttl: Duration,
        _mode: ExtendMode,
    ) -> BoxFuture<'a, Result<Duration, LockError>> {
        Box::pin(async { down() })
    }

    fn renew<'a>(&'a self, _leases: &'a [Renewal]) -> BoxFuture<'a, Result<Vec<bool>, LockError>> {
        Box::pin(async { down() })
    }

    fn holder<'a>(&'a self, _key: &'a LockKey) -> BoxFuture<'a, Result<Option<Holder>, LockError>> {
        Box::pin(async { down() })
    }

    fn waiters<'a>(&'a self, _key: &'a LockKey) -> BoxFuture<'a, Result<usize, LockError>> {
        Box::pin(async { down() })
    }
}

/// A gate handlers wait at until the test opens it, telling the test when each arrives
/// (with a label, for example the request's sequence number).
///
/// ```ignore
/// let (gate, mut control) = gate();
/// // in the handler: gate.pass(label).await;
/// let who = control.arrived().await; // a handler is inside, and waits
/// control.open();                    // let every waiting (and later) handler through
/// control.close();                   // handlers arriving from now on wait again
/// ```
#[derive(Clone)]
pub struct Gate {
    open: tokio::sync::watch::Receiver<bool>,
    arrived: mpsc::UnboundedSender<String>,
}

/// The test's side of a [`Gate`].
pub struct GateControl {
    open: tokio::sync::watch::Sender<bool>,
    arrived: mpsc::UnboundedReceiver<String>,
}

/// A closed gate and its control.
pub fn gate() -> (Gate, GateControl) {
    let (open_tx, open_rx) = tokio::sync::watch::channel(false);
    let (arrived_tx, arrived_rx) = mpsc::unbounded_channel();
    (
        Gate {
            open: open_rx,
            arrived: arrived_tx,
        },
        GateControl {
            open: open_tx,
            arrived: arrived_rx,
        },
    )
}

impl Gate {
    /// Report arrival as `who`, then wait until the gate is open.
    pub async fn pass(&self, who: String) {
        let _ = self.arrived.send(who);
        let mut open = self.open.clone();
        open.wait_for(|o| *o).await.unwrap();
    }
}

impl GateControl {
    /// The label of the next handler to arrive (panics after 10 s).
    pub async fn arrived(&mut self) -> String {
        tokio::time::timeout(Duration::from_secs(10), self.arrived.recv())
            .await
            .expect("a handler arrives within 10 s")
            .unwrap()
    }

    /// The label of a handler that has already arrived, if any (does not wait).
    pub fn try_arrived(&mut self) -> Option<String> {
        self.arrived.try_recv().ok()
    }

    /// Let waiting and later handlers through.
    pub fn open(&self) {
        self.open.send_replace(true);
    }

    /// Make handlers arriving from now on wait again.
    pub fn close(&self) {
        self.open.send_replace(false);
    }
}
