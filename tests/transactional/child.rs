//! Server processes of the tests' own: this test binary run again as a child (one test,
//! selected by name, that serves an app when `TXN_CHILD` is set), so that a test can kill
//! (SIGKILL), pause (SIGSTOP) and count real processes, each with its own pool. The
//! children report through mark files and open their handlers' gates on `POST /release`.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::Arc,
    time::Duration,
};

use axum::{extract::Request, middleware::Next, response::Response, routing};
use http::StatusCode;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

use crate::app::{Db, Gate, router};

/// What a child serves.
#[derive(Clone, Copy, Debug)]
pub(crate) enum ChildApp {
    /// The test app ([`router`]) under a transactional layer that waits 20 s.
    Payments,
    /// The fenced app ([`crate::fence::fenced_app`]) on the Postgres lock engine in schema
    /// `<schema>_locks`.
    Fenced,
    /// The actix app (`crate::actix::child_server`) under its transactional middleware.
    Actix,
    /// The plain fenced app ([`crate::fence::plain_fenced_app`]): a `LockLayer` alone, the
    /// handler's own transaction checked with a `FenceTable`.
    PlainFenced,
}

/// The server the child process runs when `TXN_CHILD` is set
/// (`app|url|schema|port|mark|listen`, `listen` the direct URL a lock engine listens on). It writes `<mark>.entered` (with what the handler
/// reported) once a handler inserted its row or took its lease, opens the gates of its
/// handlers on `POST /release`, and, for a request with `x-die-after-commit`, writes
/// `<mark>.committed` once the layer committed and then never answers. Without
/// `TXN_CHILD` it does nothing.
#[test]
fn child_server() {
    let Ok(spec) = std::env::var("TXN_CHILD") else {
        return;
    };
    let [app, url, schema, port, mark, listen]: [String; 6] = spec
        .split('|')
        .map(str::to_owned)
        .collect::<Vec<_>>()
        .try_into()
        .unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let db = Db::existing(&url, schema, false).await;
        let (gate, mut entered) = Gate::new();
        let entered_mark = format!("{mark}.entered");
        tokio::spawn(async move {
            while let Some(what) = entered.recv().await {
                // Whole or not at all, for a test that reads it as soon as it exists.
                let partial = format!("{entered_mark}.partial");
                std::fs::write(&partial, what).unwrap();
                std::fs::rename(&partial, &entered_mark).unwrap();
            }
        });
        if app == "actix" {
            let committed = format!("{mark}.committed");
            crate::actix::child_server(db, gate, committed, port.parse().unwrap()).await;
            return;
        }
        let app = match app.as_str() {
            "payments" => {
                let layer = db.layer(|b| b.wait(Duration::from_secs(20))).await;
                router(&db, layer, gate.clone())
            }
            "plain-fenced" => {
                let engine = crate::fence::lock_engine(&url, &listen, &db).await;
                crate::fence::plain_fenced_app(&db, engine, gate.clone()).await
            }
            _ => {
                let engine = crate::fence::lock_engine(&url, &listen, &db).await;
                crate::fence::fenced_app(&db, engine, gate.clone()).await
            }
        };
        let committed = Arc::new(format!("{mark}.committed"));
        let release = gate.release.clone();
        let app = app
            .layer(axum::middleware::from_fn(
                move |req: Request, next: Next| {
                    let committed = committed.clone();
                    async move { die_after_commit(&committed, req, next).await }
                },
            ))
            .route(
                "/release",
                routing::post(move || async move {
                    release.notify_one();
                    StatusCode::NO_CONTENT
                }),
            );
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port.parse::<u16>().unwrap()))
            .await
            .unwrap();
        axum::serve(listener, app).await.unwrap();
    });
}

/// Outside the layer: the layer's answer arrives after its commit; for a request marked
/// `x-die-after-commit`, say so and never write it.
async fn die_after_commit(mark: &str, req: Request, next: Next) -> Response {
    let die = req.headers().contains_key("x-die-after-commit");
    let res = next.run(req).await;
    if die {
        std::fs::write(mark, b"committed").unwrap();
        std::future::pending::<()>().await;
    }
    res
}

/// A child server process, killed (SIGKILL) when dropped.
pub(crate) struct ChildServer {
    child: Child,
    port: u16,
}

impl ChildServer {
    /// This test binary run again as the [`child_server`] serving `app` on `db`'s schema
    /// through `url` (a lock engine's listener on the shared server directly), on a free
    /// port; returns once it accepts connections.
    pub(crate) async fn start(app: ChildApp, url: &str, db: &Db, mark: &Path) -> Self {
        let listen = crate::app::shared_url().await;
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let app = match app {
            ChildApp::Payments => "payments",
            ChildApp::Fenced => "fenced",
            ChildApp::Actix => "actix",
            ChildApp::PlainFenced => "plain-fenced",
        };
        let spec = format!(
            "{app}|{url}|{}|{port}|{}|{listen}",
            db.schema,
            mark.display()
        );
        // libtest names a test by its module path, without the crate's name.
        let module = module_path!()
            .split_once("::")
            .map_or(module_path!(), |(_, m)| m);
        let child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                &format!("{module}::child_server"),
                "--nocapture",
                "--test-threads=1",
            ])
            .env("TXN_CHILD", spec)
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn the child server");
        let server = Self { child, port };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while TcpStream::connect(("127.0.0.1", port)).await.is_err() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the child server never listened"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        server
    }

    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    /// SIGKILL, and wait for the process to be gone.
    pub(crate) fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Send the process `signal` (`STOP`, `CONT`).
    pub(crate) fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([format!("-{signal}"), self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill -{signal}");
    }

    /// Open the gate of its handler that waits (`x-outcome: hang`, `x-pause`).
    pub(crate) async fn release(&self) {
        let reply = send(self.port, &request("/release", &[], "")).await;
        assert_eq!(reply.status, StatusCode::NO_CONTENT);
    }
}

impl Drop for ChildServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Waits until the child wrote `path`.
pub(crate) async fn until_written(path: &Path) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !path.exists() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} never written",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A mark path of this process's own for `name`, in a scratch directory removed when the
/// process exits (the children's `.entered` and `.committed` files with it).
pub(crate) fn mark(name: &str) -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| tower_lock_test_support::scratch::dir("txn"))
        .join(name)
}

/// The raw HTTP/1.1 `POST path` with `headers` and `body`, closing the connection after
/// its answer.
pub(crate) fn request(path: &str, headers: &[(&str, &str)], body: &str) -> String {
    let mut head = format!("POST {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n");
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    format!("{head}Content-Length: {}\r\n\r\n{body}", body.len())
}

/// An answer read off the wire.
#[derive(Debug)]
pub(crate) struct RawReply {
    pub(crate) status: StatusCode,
    /// The head, lower-cased.
    pub(crate) head: String,
    pub(crate) body: String,
}

impl RawReply {
    /// The value of header `name` (lower-case).
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().find_map(|line| {
            let (n, v) = line.split_once(':')?;
            (n == name).then(|| v.trim())
        })
    }
}

/// Send `request` to the server on `port` and read its whole answer.
pub(crate) async fn send(port: u16, request: &str) -> RawReply {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(60), stream.read_to_end(&mut answer))
        .await
        .expect("an answer within 60 s")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse::<u16>().ok())
        .unwrap_or_else(|| panic!("no status line in {answer:?}"));
    RawReply {
        status: StatusCode::from_u16(status).unwrap(),
        head: head.to_ascii_lowercase(),
        body: body.to_owned(),
    }
}
