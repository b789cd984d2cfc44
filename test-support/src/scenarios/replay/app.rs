//! The app every replay scenario serves: routes that count their runs, wait at a gate, stream
//! a body the test feeds, fail, panic, or answer what the request asks for, under one
//! idempotency layer, on either framework.

use std::sync::{
    Arc,
    atomic::{AtomicUsize, Ordering},
};

use axum::{
    body::Body,
    response::{IntoResponse, Response},
    routing::post,
};
use bytes::Bytes;
use http::StatusCode;
use tokio::sync::mpsc;
use tower_lock::IdempotencyLayer;
use tower_lock_actix::ReplayMiddleware;

use crate::{
    gate::{Gate, GateControl, gate},
    http::{TestServer, channel_body, serve, serve_actix},
    scenarios::{ACTIX_WORKERS, Framework, Stack},
};

/// An app under one idempotency layer, and the handles its scenarios drive it with.
#[derive(Debug)]
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
            let replay = ReplayMiddleware::try_from(&layer).expect("an actix layer");
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

// By value: the App it returns (an `impl` type) cannot borrow from the caller.
#[allow(clippy::needless_pass_by_value)]
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
        let h = h;
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

pub(super) fn created(n: usize, body: &str) -> Response {
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
/// (`201` without one), a `Retry-After` when it has `x-retry-after`, a `Location` when it
/// has `x-location`, `X-Run`, and the body
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
    if let Some(location) = req.get("x-location").and_then(|v| v.to_str().ok()) {
        headers.push(("location".to_owned(), location.to_owned()));
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
