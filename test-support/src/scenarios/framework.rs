//! The framework a scenario's routes are served by, and the routes themselves.

use std::sync::Arc;

use actix_web::{HttpRequest, HttpResponse, guard, web};
use axum::response::IntoResponse;
use bytes::Bytes;
use http::Method;
use tokio::sync::mpsc;
use tower_lock::{LeaseInfo, LockLayer};
use tower_lock_actix::{LockMiddleware, Locked};

use super::handler::{Answer, Handler};
use crate::{
    gate::{GateControl, gate},
    http::{TestServer, serve, serve_actix},
};

/// Where a scenario's routes are served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framework {
    /// The tower layer as each route's `route_layer`, served by axum (hyper).
    Tower,
    /// The actix middleware wrapping each route's resource, served by an actix-web
    /// `HttpServer` with [`ACTIX_WORKERS`] workers.
    Actix,
}

/// How many workers (threads, each with a runtime of its own) an actix app runs on.
pub const ACTIX_WORKERS: usize = 2;

/// A scenario's app: routes, each with the lock in front of it and the handler behind it.
#[derive(Clone, Debug, Default)]
pub struct Routes(Vec<Route>);

#[derive(Clone, Debug)]
struct Route {
    method: Method,
    path: &'static str,
    layer: LockLayer,
    handler: Handler,
}

impl Routes {
    /// No routes yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// `POST path`, locked by `layer`.
    pub fn post(self, path: &'static str, layer: &LockLayer, handler: Handler) -> Self {
        self.route(Method::POST, path, layer, handler)
    }

    /// `GET path` (and `HEAD`, answered by the same handler without a body), locked by
    /// `layer`.
    pub fn get(self, path: &'static str, layer: &LockLayer, handler: Handler) -> Self {
        self.route(Method::GET, path, layer, handler)
    }

    fn route(mut self, method: Method, path: &'static str, layer: &LockLayer, h: Handler) -> Self {
        self.0.push(Route {
            method,
            path,
            layer: layer.clone(),
            handler: h,
        });
        self
    }
}

impl Framework {
    /// Serve `routes` on a real socket. One layer on several routes is one lock table,
    /// on either framework (the actix middleware shares the layer's state).
    pub async fn serve(self, routes: Routes) -> Arc<TestServer> {
        Arc::new(match self {
            Self::Tower => serve(tower_app(routes)).await,
            Self::Actix => serve_actix(ACTIX_WORKERS, move || {
                routes.0.iter().fold(actix_web::App::new(), |app, route| {
                    app.service(actix_resource(route))
                })
            }),
        })
    }

    /// Serve `POST /work` under `layer`, its handler waiting at a closed gate
    /// ([`Handler::Gated`]); the server, and the gate's control.
    pub async fn serve_gated(self, layer: &LockLayer) -> (Arc<TestServer>, GateControl) {
        let (gate, control) = gate();
        let server = self
            .serve(Routes::new().post("/work", layer, Handler::Gated(gate)))
            .await;
        (server, control)
    }

    /// Wait until the server has dropped a streaming body whose client went away; `tx`
    /// feeds that body.
    pub async fn body_dropped(self, tx: &mpsc::Sender<Bytes>) {
        match self {
            // hyper notices a closed connection while the body waits for its next chunk.
            Self::Tower => tx.closed().await,
            // actix notices a closed connection when it next writes to it
            // (actix-web#1313): keep the body producing until actix drops it, which the
            // sender sees as a closed channel.
            Self::Actix => while tx.send(Bytes::from_static(b"more\n")).await.is_ok() {},
        }
    }
}

fn tower_app(routes: Routes) -> axum::Router {
    routes
        .0
        .into_iter()
        .fold(axum::Router::new(), |app, route| {
            let handler = route.handler;
            let respond = move |req: axum::extract::Request| {
                let handler = handler.clone();
                let seq = header(req.headers().get("x-seq"));
                let lease = req.extensions().get::<LeaseInfo>().cloned();
                async move { handler.respond(seq, lease).await.into_axum() }
            };
            // axum answers `HEAD` with the `GET` handler and drops the body.
            let method_router = match route.method {
                Method::GET => axum::routing::get(respond),
                _ => axum::routing::post(respond),
            };
            app.merge(
                axum::Router::new()
                    .route(route.path, method_router)
                    .route_layer(route.layer),
            )
        })
}

fn actix_resource(route: &Route) -> impl actix_web::dev::HttpServiceFactory + 'static {
    let handler = route.handler.clone();
    let respond = move |req: HttpRequest, lease: Option<Locked>| {
        let handler = handler.clone();
        let seq = header(req.headers().get("x-seq").map(|v| v.as_bytes()));
        async move { handler.respond(seq, lease.map(|l| l.0)).await.into_actix() }
    };
    // Like axum, answer `HEAD` with the `GET` handler (actix sends no body for it).
    let method = match route.method {
        Method::GET => web::route().guard(guard::Any(guard::Get()).or(guard::Head())),
        _ => web::post(),
    };
    web::resource(route.path)
        .wrap(LockMiddleware::try_from(&route.layer).expect("an actix layer"))
        .route(method.to(respond))
}

/// A header's value as text, or nothing.
fn header<V: AsRef<[u8]>>(value: Option<V>) -> String {
    value.map_or(String::new(), |v| {
        String::from_utf8_lossy(v.as_ref()).into_owned()
    })
}

impl Answer {
    fn into_axum(self) -> axum::response::Response {
        match self {
            Self::Text(text) => text.into_response(),
            Self::Empty(status) => status.into_response(),
            Self::Stream(body) => axum::response::Response::new(axum::body::Body::new(body)),
        }
    }

    fn into_actix(self) -> HttpResponse {
        match self {
            Self::Text(text) => HttpResponse::Ok().body(text),
            Self::Empty(status) => {
                let status = actix_web::http::StatusCode::from_u16(status.as_u16()).unwrap();
                HttpResponse::build(status).finish()
            }
            Self::Stream(body) => HttpResponse::Ok().body(body),
        }
    }
}
