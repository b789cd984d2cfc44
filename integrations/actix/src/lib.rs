//! actix-web integration for [tower-lock](tower_lock): a native actix middleware over the
//! same lock engine and the same request locker as the tower [`LockLayer`].
//!
//! actix-web 4 is not built on tower (and speaks `http` 0.2), so it gets its own
//! [`Transform`]: [`LockMiddleware`]. It does no lock logic of its own. Each request is
//! shown to the framework-neutral [`RequestLocker`] through [`ActixRequest`], a
//! [`RequestView`] over actix's request head, and the locker's decision is mapped onto
//! actix types: the same key extractors, the same `400`/`409`/`423`/`429`/`503` statuses,
//! the same `Retry-After` and the same `application/problem+json` bodies as the tower
//! layer (or the layer's `on_reject` hook).
//!
//! - **One lock table for all workers.** Build the middleware once, outside
//!   [`HttpServer::new`](actix_web::HttpServer::new), and clone it into the
//!   app factory: every worker thread then locks on one lock table. A locker built inside
//!   the factory would give each worker its own lock table, and requests served by
//!   different workers would not exclude each other.
//! - **The lease lives until the body ends.** The response body is wrapped in
//!   [`LockedBody`], which owns the lease and drops it when the last chunk has been taken,
//!   when the body fails, or when actix drops the body (the client went away). A response
//!   with no body to send (`204`, `304`, any answer to `HEAD`, a body of size none or 0),
//!   which actix never polls, is released before it is handed to actix, the release
//!   completed, so a client's next request never meets its own previous lease.
//! - **Handlers see their lease** with the [`Locked`] and [`LockFence`] extractors.
//!
//! ```no_run
//! use std::time::Duration;
//! use actix_web::{App, HttpServer, web};
//! use tower_lock::{LockEngine, LockLayer, key::HeaderKey};
//! use tower_lock_actix::{LockFence, LockMiddleware};
//!
//! async fn rebuild(LockFence(fence): LockFence) -> String {
//!     // Hand the fencing token to the storage the lock protects.
//!     format!("rebuilt under fence {fence}")
//! }
//!
//! #[actix_web::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     // Once, outside the app factory: all workers share this lock table.
//!     let per_tenant = LockMiddleware::new(
//!         LockLayer::builder(LockEngine::in_memory())
//!             .key(HeaderKey::new("x-tenant-id".parse()?))
//!             .wait(Duration::from_secs(2)) // queue up to 2 s, then 429
//!             .fifo(true)
//!             .build_locker()?,
//!     );
//!     HttpServer::new(move || {
//!         App::new().service(
//!             web::resource("/rebuild")
//!                 .wrap(per_tenant.clone())
//!                 .route(web::post().to(rebuild)),
//!         )
//!     })
//!     .workers(4)
//!     .bind(("127.0.0.1", 8080))?
//!     .run()
//!     .await?;
//!     Ok(())
//! }
//! ```
//!
//! The same middleware, driven by actix's test harness:
//!
//! ```
//! use std::time::Duration;
//! use actix_web::{App, http::StatusCode, test, web};
//! use tower_lock::{LockEngine, LockLayer};
//! use tower_lock_actix::{LockMiddleware, Locked};
//!
//! # #[actix_web::main]
//! # async fn main() {
//! let engine = LockEngine::in_memory();
//! let lock = LockMiddleware::from(LockLayer::idempotency(engine.clone()).without_replay().build().unwrap());
//! let app = test::init_service(
//!     App::new().service(
//!         web::resource("/orders")
//!             .wrap(lock)
//!             .route(web::post().to(|Locked(lease): Locked| async move {
//!                 format!("created under {}", lease.key())
//!             })),
//!     ),
//! )
//! .await;
//!
//! let order = || test::TestRequest::post().uri("/orders").insert_header(("idempotency-key", "\"o-1\""));
//! let res = test::call_service(&app, order().to_request()).await;
//! assert_eq!(res.status(), StatusCode::OK);
//! // The response body holds the key until it has been read (or dropped).
//! assert_eq!(test::read_body(res).await, "created under /idempotency-key/o-1");
//!
//! // While another request holds the key, a duplicate is answered 409.
//! let held = engine
//!     .lock("/idempotency-key/o-1")
//!     .wait(Duration::from_secs(5)) // the release above runs in the background
//!     .acquire()
//!     .await
//!     .unwrap();
//! let res = test::call_service(&app, order().to_request()).await;
//! assert_eq!(res.status(), StatusCode::CONFLICT);
//! assert!(res.headers().contains_key("retry-after"));
//! drop(held);
//!
//! let missing = test::TestRequest::post().uri("/orders").to_request();
//! assert_eq!(test::call_service(&app, missing).await.status(), StatusCode::BAD_REQUEST);
//! # }
//! ```
//!
//! # Client disconnects
//!
//! A client that leaves while the body streams frees the key as soon as actix drops the
//! body. actix-web notices a closed connection only when it reads from or writes to it,
//! though: a handler that is still running (or a body that has nothing to send) when the
//! client leaves keeps the key until it produces something or finishes
//! ([actix-web#1313](https://github.com/actix/actix-web/issues/1313)). The lease's TTL and
//! the handler's own timeouts bound that.

mod replay;
mod route_key;

pub use replay::{ReplayBody, ReplayMiddleware, ReplayMiddlewareService};
pub use route_key::RouteKey;

use std::{
    any::Any,
    fmt,
    future::{Future, Ready, ready},
    pin::Pin,
    rc::Rc,
    task::{Context, Poll},
};

use actix_web::{
    Error, FromRequest, HttpMessage, HttpRequest, HttpResponse, ResponseError,
    body::{BodySize, BoxBody, EitherBody, MessageBody},
    dev::{Payload, Service, ServiceRequest, ServiceResponse, Transform},
    http::{
        Method, StatusCode,
        header::{HeaderName, HeaderValue},
    },
};
use bytes::Bytes;
use pin_project_lite::pin_project;
use tower_lock::{
    Fence, LeaseInfo, LockLayer, LockMetrics,
    idempotency::NotStored,
    integration::{LockGuard, Outcome, RequestLocker},
    key::RequestView,
};

/// An actix request seen as a [`RequestView`], so that tower-lock's key extractors and
/// [`RequestLocker`] work on actix requests.
///
/// Extractors written for actix reach the whole [`HttpRequest`] through it (see
/// [`http_request`]): its extensions, the matched route and its parameters (as
/// [`RouteKey`] does). Extractors that need `http` 1 extensions (axum's route keys,
/// [`PrincipalScopedKey`](tower_lock::key::PrincipalScopedKey)) find none here.
///
/// ```
/// use actix_web::test::TestRequest;
/// use tower_lock::key::{IdempotencyKey, KeyExtractor};
/// use tower_lock_actix::ActixRequest;
///
/// let req = TestRequest::post().insert_header(("idempotency-key", "\"k-1\"")).to_srv_request();
/// let key = IdempotencyKey::new().extract(&ActixRequest::from(&req)).unwrap();
/// assert_eq!(key.as_deref(), Some("k-1"));
/// ```
#[derive(Clone, Copy, Debug)]
pub struct ActixRequest<'a> {
    req: &'a HttpRequest,
}

impl<'a> ActixRequest<'a> {
    /// A view of `req`.
    pub fn new(req: &'a HttpRequest) -> Self {
        ActixRequest { req }
    }
}

impl<'a> From<&'a ServiceRequest> for ActixRequest<'a> {
    fn from(req: &'a ServiceRequest) -> Self {
        ActixRequest::new(req.request())
    }
}

impl<'a> From<&'a HttpRequest> for ActixRequest<'a> {
    fn from(req: &'a HttpRequest) -> Self {
        ActixRequest::new(req)
    }
}

impl RequestView for ActixRequest<'_> {
    fn method(&self) -> &str {
        self.req.head().method.as_str()
    }

    fn path(&self) -> &str {
        self.req.head().uri.path()
    }

    fn header(&self, name: &str) -> Option<&[u8]> {
        self.req.headers().get(name).map(HeaderValue::as_bytes)
    }

    fn header_values(&self, name: &str, each: &mut dyn FnMut(&[u8])) {
        for value in self.req.headers().get_all(name) {
            each(value.as_bytes());
        }
    }

    fn authority(&self) -> Option<&[u8]> {
        match self.req.head().uri.authority() {
            Some(authority) => Some(authority.as_str().as_bytes()),
            None => self.header("host"),
        }
    }

    fn query(&self) -> Option<&str> {
        self.req.head().uri.query()
    }

    fn framework_request(&self) -> Option<&dyn Any> {
        Some(self.req)
    }
}

/// The actix-web request behind `req`, when `req` is an [`ActixRequest`] (the view
/// [`LockMiddleware`] shows extractors): for extractors written for actix, to read the
/// request's extensions, its matched route, its app data.
///
/// ```
/// use actix_web::{HttpMessage, test::TestRequest};
/// use tower_lock::key::{self, KeyExtractor, MalformedKey, RequestView};
/// use tower_lock_actix::{ActixRequest, http_request};
///
/// /// Put in the extensions by an authentication middleware.
/// #[derive(Clone)]
/// struct UserId(u64);
///
/// // One request at a time per signed-in user.
/// let per_user = key::from_fn("user", |req: &dyn RequestView| {
///     let Some(req) = http_request(req) else {
///         return Err(MalformedKey::new("not an actix request"));
///     };
///     Ok(req.extensions().get::<UserId>().map(|user| user.0.to_string()))
/// });
///
/// let req = TestRequest::post().to_srv_request();
/// req.extensions_mut().insert(UserId(7));
/// assert_eq!(per_user.extract(&ActixRequest::from(&req)).unwrap().as_deref(), Some("7"));
/// ```
pub fn http_request(req: &dyn RequestView) -> Option<&HttpRequest> {
    req.framework_request()?.downcast_ref::<HttpRequest>()
}

/// The tower-lock middleware for actix-web: a [`Transform`] that serializes the wrapped
/// service per lock key, as configured by a [`RequestLocker`].
///
/// Build it once, outside the `HttpServer::new` app factory, and clone it into the
/// factory: clones share one lock table and one set of metrics (see the
/// [crate docs](crate)). Wrap a [`web::resource`](actix_web::web::resource) or
/// [`web::scope`](actix_web::web::scope) rather than the whole `App`, so that only
/// requests that reached a guarded route take a lock and an unknown path stays a `404`.
#[derive(Clone, Debug)]
pub struct LockMiddleware {
    locker: RequestLocker,
}

impl LockMiddleware {
    /// A middleware locking with `locker` (from
    /// [`LockLayerBuilder::build_locker`](tower_lock::LockLayerBuilder::build_locker)).
    pub fn new(locker: RequestLocker) -> Self {
        LockMiddleware { locker }
    }

    /// The framework-neutral runtime core the middleware locks with.
    pub fn locker(&self) -> &RequestLocker {
        &self.locker
    }

    /// The middleware's counters and histograms.
    pub fn metrics(&self) -> LockMetrics {
        self.locker.metrics()
    }
}

impl From<RequestLocker> for LockMiddleware {
    fn from(locker: RequestLocker) -> Self {
        LockMiddleware::new(locker)
    }
}

/// The middleware shares the layer's locker: a tower service and an actix app built from
/// one layer exclude each other.
impl From<LockLayer> for LockMiddleware {
    fn from(layer: LockLayer) -> Self {
        LockMiddleware::new(layer.locker().clone())
    }
}

impl From<&LockLayer> for LockMiddleware {
    fn from(layer: &LockLayer) -> Self {
        LockMiddleware::new(layer.locker().clone())
    }
}

impl<S, B> Transform<S, ServiceRequest> for LockMiddleware
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = Error> + 'static,
    B: MessageBody + 'static,
{
    type Response = ServiceResponse<EitherBody<LockedBody<B>>>;
    type Error = Error;
    type Transform = LockMiddlewareService<S>;
    type InitError = ();
    type Future = Ready<Result<Self::Transform, Self::InitError>>;

    fn new_transform(&self, service: S) -> Self::Future {
        // Clone the locker handle, never build state here: actix calls this once per
        // worker, and every worker must lock on the same table.
        ready(Ok(LockMiddlewareService {
            service: Rc::new(service),
            locker: self.locker.clone(),
        }))
    }
}

/// The service [`LockMiddleware`] wraps around an actix service (one per worker).
pub struct LockMiddlewareService<S> {
    // Shared with the response future, which calls it once the lock is decided.
    service: Rc<S>,
    locker: RequestLocker,
}

impl<S> fmt::Debug for LockMiddlewareService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockMiddlewareService")
            .field("locker", &self.locker)
            .finish_non_exhaustive()
    }
}

type LocalBoxFuture<T> = Pin<Box<dyn Future<Output = T> + 'static>>;

impl<S, B> Service<ServiceRequest> for LockMiddlewareService<S>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = Error> + 'static,
    B: MessageBody + 'static,
{
    type Response = ServiceResponse<EitherBody<LockedBody<B>>>;
    type Error = Error;
    type Future = LocalBoxFuture<Result<Self::Response, Self::Error>>;

    actix_web::dev::forward_ready!(service);

    fn call(&self, req: ServiceRequest) -> Self::Future {
        // The key is extracted now, while the request is borrowed; the returned future
        // (the wait, if any) owns everything it needs.
        let acquire = self.locker.acquire(&ActixRequest::from(&req));
        // A response to HEAD has no body to send, whatever the handler answers.
        let head = req.method() == Method::HEAD;
        let service = Rc::clone(&self.service);
        let locker = self.locker.clone();
        Box::pin(async move {
            // Dropping this future (actix gave up on the request) gives up the wait, or
            // drops `held` and releases the key.
            let held = match acquire.await {
                Outcome::Locked(held) => {
                    req.extensions_mut().insert(held.info().clone());
                    Some(held)
                }
                Outcome::Unlocked => None,
                Outcome::Rejected(rejection) => {
                    let response =
                        to_actix_response(locker.respond(rejection, &ActixRequest::from(&req)));
                    return Ok(req.into_response(response).map_into_right_body());
                }
            };
            let response = service.call(req).await?;
            let mut held = held;
            if let Some(h) = held.take() {
                let status = response.status().as_u16();
                let release = locker.release_point();
                let empty = matches!(
                    response.response().body().size(),
                    BodySize::None | BodySize::Sized(0)
                );
                if release.releases_with_response(status) {
                    h.release_now();
                } else if release.releases_before_response(status, head || empty) {
                    // actix never polls a body it must not send: releasing at the body's
                    // end would come after the client has the response.
                    h.release().await;
                } else {
                    held = Some(h);
                }
            }
            Ok(response.map_body(|_, body| EitherBody::left(LockedBody::new(body, held))))
        })
    }
}

/// Converts the locker's `http` 1 response into an actix (`http` 0.2) one. Status and
/// header names and values were valid in `http` 1 and are valid here; anything that is
/// not is left out rather than failing the request.
fn to_actix_response(res: http::Response<Bytes>) -> HttpResponse<BoxBody> {
    let (parts, body) = res.into_parts();
    let status =
        StatusCode::from_u16(parts.status.as_u16()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = HttpResponse::with_body(status, body);
    if parts.extensions.get::<NotStored>().is_some() {
        // A rejection: an idempotency middleware outside must not store it.
        response.extensions_mut().insert(NotStored);
    }
    let headers = response.headers_mut();
    for (name, value) in &parts.headers {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_str().as_bytes()),
            HeaderValue::from_bytes(value.as_bytes()),
        ) {
            headers.append(name, value);
        }
    }
    response.map_into_boxed_body()
}

pin_project! {
    /// A response body that owns the request's lease and releases it when the body ends:
    /// its last chunk has been taken, it failed, or it was dropped (the client went away).
    pub struct LockedBody<B> {
        #[pin]
        body: B,
        held: Option<LockGuard>,
    }
}

impl<B> LockedBody<B> {
    /// `body`, holding `held` (if any) until it ends.
    pub fn new(body: B, held: Option<LockGuard>) -> Self {
        LockedBody { body, held }
    }

    /// `true` while the body still holds its lease.
    pub fn is_holding(&self) -> bool {
        self.held.is_some()
    }

    /// The wrapped body.
    pub fn get_ref(&self) -> &B {
        &self.body
    }
}

impl<B> fmt::Debug for LockedBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockedBody")
            .field("held", &self.held)
            .finish_non_exhaustive()
    }
}

impl<B: MessageBody> MessageBody for LockedBody<B> {
    type Error = B::Error;

    fn size(&self) -> BodySize {
        self.body.size()
    }

    fn poll_next(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, Self::Error>>> {
        let this = self.project();
        let chunk = std::task::ready!(this.body.poll_next(cx));
        if !matches!(chunk, Some(Ok(_)))
            && let Some(held) = this.held.take()
        {
            // The body is done (or broken): release before the response completes, so a
            // client that has the whole response finds the key free for its next request.
            held.release_now();
        }
        Poll::Ready(chunk)
    }

    // `try_into_bytes` keeps its default (refuse): taking the bytes out would drop the
    // lease before the response is written.
}

/// Extracts the [`LeaseInfo`] of the lock the request holds: its key, fencing token, wait
/// time and lost signal.
///
/// Fails with [`LockNotInstalled`] (`500`) when the request holds no lock: the middleware
/// does not wrap this route, or it let the request pass unlocked (no key under
/// [`MissingKeyPolicy::PassThrough`](tower_lock::MissingKeyPolicy::PassThrough), or the
/// fail-open policy). Extract `Option<Locked>` where that is expected.
#[derive(Clone, Debug)]
pub struct Locked(pub LeaseInfo);

impl FromRequest for Locked {
    type Error = LockNotInstalled;
    type Future = Ready<Result<Self, Self::Error>>;

    fn from_request(req: &HttpRequest, _payload: &mut Payload) -> Self::Future {
        ready(
            req.extensions()
                .get::<LeaseInfo>()
                .cloned()
                .map(Locked)
                .ok_or(LockNotInstalled),
        )
    }
}

/// Extracts just the fencing token of the lock the request holds; pass it to the storage
/// the lock protects. Fails like [`Locked`].
#[derive(Clone, Copy, Debug)]
pub struct LockFence(pub Fence);

impl FromRequest for LockFence {
    type Error = LockNotInstalled;
    type Future = Ready<Result<Self, Self::Error>>;

    fn from_request(req: &HttpRequest, _payload: &mut Payload) -> Self::Future {
        ready(
            req.extensions()
                .get::<LeaseInfo>()
                .map(|info| LockFence(info.fence()))
                .ok_or(LockNotInstalled),
        )
    }
}

/// The request holds no lock: the middleware does not wrap this route, or let the request
/// pass unlocked. A server bug, answered `500 Internal Server Error`.
#[derive(Clone, Copy, Debug, Default)]
#[non_exhaustive]
pub struct LockNotInstalled;

impl fmt::Display for LockNotInstalled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(
            "the handler needs a lock, but the request holds none (is the tower-lock middleware wrapping this route?)",
        )
    }
}

impl std::error::Error for LockNotInstalled {}

impl ResponseError for LockNotInstalled {
    fn status_code(&self) -> StatusCode {
        StatusCode::INTERNAL_SERVER_ERROR
    }
}

// The README's code blocks compile as doctests, so it cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
