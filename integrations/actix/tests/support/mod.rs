//! Fixtures for the actix tests: an actix `HttpServer` on a real loopback socket, a
//! hyper-util client, and a response body fed from a channel.
#![allow(dead_code, unreachable_pub)]

use std::{
    convert::Infallible,
    net::SocketAddr,
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};

use actix_web::{
    body::{BodySize, MessageBody},
    dev::{Server, ServerHandle},
};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::TokioExecutor,
};
use tokio::{net::TcpListener, sync::mpsc};

/// A server on 127.0.0.1 (actix or axum), with a client; an actix server is stopped when
/// this is dropped.
pub struct TestServer {
    addr: SocketAddr,
    actix: Option<ServerHandle>,
    client: Client<HttpConnector, Full<Bytes>>,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(handle) = self.actix.take() {
            tokio::spawn(async move { handle.stop(false).await });
        }
    }
}

fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

/// Run an actix server that is bound to `addr`. Its workers run on their own threads and
/// runtimes; the accept loop is driven by a task on the test's runtime.
pub fn spawn_actix(server: Server, addr: SocketAddr) -> TestServer {
    let handle = server.handle();
    tokio::spawn(server);
    TestServer {
        addr,
        actix: Some(handle),
        client: client(),
    }
}

/// Serve an axum app (the tower layer) for side-by-side comparisons.
pub async fn serve_axum(app: axum::Router) -> TestServer {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    TestServer {
        addr,
        actix: None,
        client: client(),
    }
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
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {:?}", self.text()))
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

    /// Send `method path` with `headers`; the response body is still streaming.
    pub async fn send_streaming(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
    ) -> http::Response<hyper::body::Incoming> {
        let mut req = http::Request::builder()
            .method(method)
            .uri(format!("http://{}{}", self.addr, path));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req.body(Full::new(Bytes::new())).unwrap();
        tokio::time::timeout(Duration::from_secs(20), self.client.request(req))
            .await
            .expect("response head within 20 s")
            .expect("request succeeds")
    }

    /// Send `method path` with `headers` and collect the response.
    pub async fn send(&self, method: &str, path: &str, headers: &[(&str, &str)]) -> Reply {
        let (parts, body) = self
            .send_streaming(method, path, headers)
            .await
            .into_parts();
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
        self.send("POST", path, headers).await
    }
}

/// An actix response body whose chunks are sent through a channel; it ends when the
/// sender is dropped, and the sender sees it closed when actix drops the body.
pub struct ChannelBody {
    rx: mpsc::Receiver<Bytes>,
}

/// A channel body and its sender.
pub fn channel_body() -> (mpsc::Sender<Bytes>, ChannelBody) {
    let (tx, rx) = mpsc::channel(8);
    (tx, ChannelBody { rx })
}

impl MessageBody for ChannelBody {
    type Error = Infallible;

    fn size(&self) -> BodySize {
        BodySize::Stream
    }

    fn poll_next(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, Self::Error>>> {
        self.rx.poll_recv(cx).map(|chunk| chunk.map(Ok))
    }
}
