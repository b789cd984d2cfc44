//! A test app on a real loopback socket (axum or actix), and a hyper-util client for it.

use std::{fmt, net::SocketAddr, time::Duration};

use actix_http::{Request, Response};
use actix_service::IntoServiceFactory;
use actix_web::{
    body::MessageBody,
    dev::{AppConfig, ServerHandle, Service, ServiceFactory},
};
use axum::serve::ListenerExt;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::TokioExecutor,
};
use tokio::{
    io::AsyncWriteExt,
    net::{TcpListener, TcpStream},
    task::JoinHandle,
};

use super::Reply;

/// An app served on 127.0.0.1 on a free port, with a client; stopped when dropped.
pub struct TestServer {
    addr: SocketAddr,
    running: Running,
    client: Client<HttpConnector, Full<Bytes>>,
}

/// What stops the server when the [`TestServer`] is dropped.
enum Running {
    /// axum's accept loop, a task on the test's runtime.
    Axum(JoinHandle<()>),
    /// An actix `HttpServer`: workers on threads of their own, the accept loop driven by a
    /// task on the test's runtime.
    Actix(ServerHandle),
}

impl Drop for TestServer {
    fn drop(&mut self) {
        match &self.running {
            Running::Axum(task) => task.abort(),
            Running::Actix(handle) => {
                let handle = handle.clone();
                tokio::spawn(async move { handle.stop(false).await });
            }
        }
    }
}

impl fmt::Debug for TestServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.running {
            Running::Axum(_) => "axum",
            Running::Actix(_) => "actix",
        };
        f.debug_struct("TestServer")
            .field("addr", &self.addr)
            .field("kind", &kind)
            .finish()
    }
}

/// Serve an axum `app` (routes under the tower layer) on a real socket.
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
    TestServer::new(addr, Running::Axum(task))
}

/// Serve the actix app that `factory` builds (once per worker) with `workers` workers.
pub fn serve_actix<F, I, S, B>(workers: usize, factory: F) -> TestServer
where
    F: Fn() -> I + Send + Clone + 'static,
    I: IntoServiceFactory<S, Request>,
    S: ServiceFactory<Request, Config = AppConfig> + 'static,
    S::Error: Into<actix_web::Error> + 'static,
    S::InitError: fmt::Debug,
    S::Response: Into<Response<B>> + 'static,
    <S::Service as Service<Request>>::Future: 'static,
    S::Service: 'static,
    B: MessageBody + 'static,
{
    let server = actix_web::HttpServer::new(factory)
        .workers(workers)
        .disable_signals()
        .bind(("127.0.0.1", 0))
        .unwrap();
    let addr = server.addrs()[0];
    let server = server.run();
    let handle = server.handle();
    tokio::spawn(server);
    TestServer::new(addr, Running::Actix(handle))
}

impl TestServer {
    fn new(addr: SocketAddr, running: Running) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new()).build(connector);
        Self {
            addr,
            running,
            client,
        }
    }

    /// The server's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Send `method path` with `headers`; the response's body is still streaming.
    pub async fn send_streaming(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
    ) -> http::Response<hyper::body::Incoming> {
        self.send_streaming_body(method, path, headers, Bytes::new())
            .await
    }

    /// Send `method path` with `headers` and `body`; the response's body is still
    /// streaming.
    pub async fn send_streaming_body(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Bytes,
    ) -> http::Response<hyper::body::Incoming> {
        let mut req = http::Request::builder()
            .method(method)
            .uri(format!("http://{}{}", self.addr, path));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req.body(Full::new(body)).unwrap();
        tokio::time::timeout(Duration::from_secs(20), self.client.request(req))
            .await
            .expect("response head within 20 s")
            .expect("request succeeds")
    }

    /// Send `method path` with `headers` and collect the whole response.
    pub async fn send(&self, method: &str, path: &str, headers: &[(&str, &str)]) -> Reply {
        self.send_body(method, path, headers, Bytes::new()).await
    }

    /// Send `method path` with `headers` and `body`, and collect the whole response.
    pub async fn send_body(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: impl Into<Bytes>,
    ) -> Reply {
        let (parts, body) = self
            .send_streaming_body(method, path, headers, body.into())
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

    /// A plain TCP connection to the server on which `request` (raw HTTP/1.1) was written:
    /// for reading the bytes on the wire, or for leaving in the middle of a response.
    pub async fn raw(&self, request: &str) -> TcpStream {
        let mut stream = TcpStream::connect(self.addr).await.unwrap();
        stream.write_all(request.as_bytes()).await.unwrap();
        stream
    }
}
