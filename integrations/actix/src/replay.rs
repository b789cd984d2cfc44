//! [`ReplayMiddleware`]: idempotency replay on actix-web, over the same framework-neutral
//! [`ReplayLocker`] as the tower [`IdempotencyLayer`].

use std::{
    fmt,
    future::{Future, Ready, ready},
    panic::{self, AssertUnwindSafe},
    pin::Pin,
    rc::Rc,
    task::{Context, Poll},
};

use actix_web::rt::time::Instant;
use actix_web::{
    Error, FromRequest, HttpMessage,
    body::{BodySize, EitherBody, MessageBody},
    dev::{Payload, Service, ServiceRequest, ServiceResponse, Transform},
    web,
};
use bytes::Bytes;
use tower_lock::{
    IdempotencyLayer, LockMetrics,
    idempotency::{Begin, Capture, Completion, NotStored, ReplayLocker},
};

use crate::{ActixRequest, LocalBoxFuture, to_actix_response};

/// Idempotency with response replay for actix-web: the actix counterpart of
/// [`IdempotencyLayer`], with the same semantics (see [`tower_lock::idempotency`]).
///
/// Build it once, outside the `HttpServer::new` app factory (every worker must share its
/// records and locks), and wrap the resources that create things:
///
/// ```
/// use actix_web::{App, HttpResponse, web};
/// use tower_lock::{LockEngine, LockLayer};
/// use tower_lock_actix::ReplayMiddleware;
///
/// let replay = ReplayMiddleware::from(
///     LockLayer::idempotency(LockEngine::in_memory()).unscoped().build().unwrap(),
/// );
/// let app = App::new().service(
///     web::resource("/orders")
///         .wrap(replay.clone())
///         .route(web::post().to(|| async { HttpResponse::Created().body("order 1") })),
/// );
/// # let _ = app;
/// ```
#[derive(Clone, Debug)]
pub struct ReplayMiddleware {
    replay: ReplayLocker,
}

impl ReplayMiddleware {
    /// A middleware over `replay` (from
    /// [`IdempotencyLayerBuilder::build_replay_locker`](tower_lock::IdempotencyLayerBuilder::build_replay_locker)).
    pub fn new(replay: ReplayLocker) -> Self {
        ReplayMiddleware { replay }
    }

    /// The middleware's counters and histograms (replays included).
    pub fn metrics(&self) -> LockMetrics {
        self.replay.locker().metrics()
    }
}

impl From<ReplayLocker> for ReplayMiddleware {
    fn from(replay: ReplayLocker) -> Self {
        ReplayMiddleware::new(replay)
    }
}

/// Shares the layer's records and locks: a tower service and an actix app built from one
/// layer replay each other's responses.
impl From<IdempotencyLayer> for ReplayMiddleware {
    fn from(layer: IdempotencyLayer) -> Self {
        ReplayMiddleware::new(layer.replay_locker().clone())
    }
}

impl From<&IdempotencyLayer> for ReplayMiddleware {
    fn from(layer: &IdempotencyLayer) -> Self {
        ReplayMiddleware::new(layer.replay_locker().clone())
    }
}

impl<S, B> Transform<S, ServiceRequest> for ReplayMiddleware
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = Error> + 'static,
    B: MessageBody + 'static,
{
    type Response = ServiceResponse<EitherBody<ReplayBody<B>>>;
    type Error = Error;
    type Transform = ReplayMiddlewareService<S>;
    type InitError = ();
    type Future = Ready<Result<Self::Transform, Self::InitError>>;

    fn new_transform(&self, service: S) -> Self::Future {
        ready(Ok(ReplayMiddlewareService {
            service: Rc::new(service),
            replay: self.replay.clone(),
        }))
    }
}

/// The service [`ReplayMiddleware`] wraps around an actix service (one per worker).
pub struct ReplayMiddlewareService<S> {
    service: Rc<S>,
    replay: ReplayLocker,
}

impl<S> fmt::Debug for ReplayMiddlewareService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReplayMiddlewareService")
            .field("replay", &self.replay)
            .finish_non_exhaustive()
    }
}

impl<S, B> Service<ServiceRequest> for ReplayMiddlewareService<S>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = Error> + 'static,
    B: MessageBody + 'static,
{
    type Response = ServiceResponse<EitherBody<ReplayBody<B>>>;
    type Error = Error;
    type Future = LocalBoxFuture<Result<Self::Response, Self::Error>>;

    actix_web::dev::forward_ready!(service);

    fn call(&self, mut req: ServiceRequest) -> Self::Future {
        let service = Rc::clone(&self.service);
        let replay = self.replay.clone();
        let key = replay.key(&ActixRequest::from(&req));
        Box::pin(async move {
            let reject = |req: ServiceRequest, rejection| {
                let res = to_actix_response(replay.respond(rejection, &ActixRequest::from(&req)));
                Ok(req.into_response(res).map_into_right_body())
            };
            let key = match key {
                Ok(Some(key)) => key,
                Ok(None) => {
                    let res = service.call(req).await?;
                    return Ok(res.map_body(|_, b| EitherBody::left(ReplayBody::plain(b))));
                }
                Err(rejection) => return reject(req, rejection),
            };
            // The whole body, before the lock.
            let limit = replay.max_request_body();
            let (http_req, payload) = req.parts_mut();
            let payload = web::Payload::from_request(http_req, payload).await?;
            let data = match payload.to_bytes_limited(limit).await {
                Ok(Ok(data)) => data,
                Ok(Err(_)) => return reject(req, replay.unreadable()),
                Err(_) => return reject(req, replay.too_large()),
            };
            let fingerprint = replay.fingerprint(&ActixRequest::from(&req), &data);
            match replay.begin(key, fingerprint).await {
                Begin::Replay(res) => Ok(req
                    .into_response(to_actix_response(res))
                    .map_into_right_body()),
                Begin::Rejected(rejection) => reject(req, rejection),
                Begin::Unlocked => {
                    req.set_payload(Payload::from(data));
                    let res = service.call(req).await?;
                    Ok(res.map_body(|_, b| EitherBody::left(ReplayBody::plain(b))))
                }
                Begin::Run(completion) => {
                    req.set_payload(Payload::from(data));
                    req.extensions_mut().insert(completion.info().clone());
                    let running = KeepRunning {
                        future: Some(Box::pin(service.call(req))),
                        completion: Some(completion),
                    };
                    let (res, completion) = running.await;
                    // A handler error drops the completion: released, nothing stored.
                    let res = res?;
                    let capture = capture(completion, &res);
                    if matches!(
                        res.response().body().size(),
                        BodySize::None | BodySize::Sized(0)
                    ) {
                        // actix never polls a body it must not send.
                        capture.finish().await;
                        return Ok(res.map_body(|_, b| EitherBody::left(ReplayBody::plain(b))));
                    }
                    Ok(res.map_body(|_, b| EitherBody::left(ReplayBody::capturing(b, capture))))
                }
            }
        })
    }
}

/// The handler's future and the request's completion: if dropped before the response is
/// there (actix gave up on a client that left), the handler runs on to completion on the
/// worker, its response is stored, and the key is released only then.
struct KeepRunning<B: MessageBody + 'static> {
    future: Option<LocalBoxFuture<Result<ServiceResponse<B>, Error>>>,
    completion: Option<Completion>,
}

impl<B: MessageBody + 'static> Future for KeepRunning<B> {
    type Output = (Result<ServiceResponse<B>, Error>, Completion);

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let future = self.future.as_mut().expect("polled after completion");
        let res = match panic::catch_unwind(AssertUnwindSafe(|| future.as_mut().poll(cx))) {
            Ok(poll) => std::task::ready!(poll),
            Err(panic) => {
                // The handler panicked: never poll it again. Release, store nothing, and
                // let the panic cost this request alone.
                self.future = None;
                self.completion = None;
                panic::resume_unwind(panic)
            }
        };
        self.future = None;
        let completion = self.completion.take().expect("polled after completion");
        Poll::Ready((res, completion))
    }
}

impl<B: MessageBody + 'static> Drop for KeepRunning<B> {
    fn drop(&mut self) {
        let (Some(future), Some(completion)) = (self.future.take(), self.completion.take()) else {
            return;
        };
        actix_web::rt::spawn(async move {
            let Ok(res) = future.await else {
                return;
            };
            let capture = capture(completion, &res);
            drain(Box::pin(res.into_body()), capture).await;
        });
    }
}

/// The capture of `res`: none for a response marked [`NotStored`].
fn capture<B>(completion: Completion, res: &ServiceResponse<B>) -> Capture {
    if res.response().extensions().get::<NotStored>().is_some() {
        return completion.not_stored();
    }
    completion.capture(
        http::StatusCode::from_u16(res.status().as_u16())
            .unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR),
        &http_headers(res.headers()),
    )
}

/// Read a body no client reads any more into its capture (up to just past the limit, for
/// at most the drain time), then store it.
async fn drain<B: MessageBody>(mut body: Pin<Box<B>>, mut capture: Capture) {
    let deadline = Instant::now() + capture.max_drain_time();
    while capture.wants_data() {
        let next = std::future::poll_fn(|cx| body.as_mut().poll_next(cx));
        match actix_web::rt::time::timeout(deadline.saturating_duration_since(Instant::now()), next)
            .await
        {
            // A body that does not end is cut off: completed, not stored, released.
            Err(_) => {
                capture.cut_off();
                break;
            }
            Ok(None) => break,
            Ok(Some(Ok(chunk))) => capture.data(&chunk),
            // Failed mid-stream: nothing stored, released (the capture is dropped).
            Ok(Some(Err(_))) => return,
        }
    }
    capture.finish().await;
}

/// The response headers as `http` 1 headers, for the capture.
fn http_headers(headers: &actix_web::http::header::HeaderMap) -> http::HeaderMap {
    let mut out = http::HeaderMap::with_capacity(headers.len());
    for (name, value) in headers {
        if let (Ok(name), Ok(value)) = (
            http::HeaderName::from_bytes(name.as_str().as_bytes()),
            http::HeaderValue::from_bytes(value.as_bytes()),
        ) {
            out.append(name, value);
        }
    }
    out
}

/// The response body of [`ReplayMiddleware`]: the handler's body, captured for replay while
/// it streams to the client, or passed through untouched.
///
/// Dropped before its end (the client left mid-body), it reads the rest on the worker,
/// stores the response and releases the key.
pub struct ReplayBody<B: MessageBody + 'static> {
    body: Option<Pin<Box<B>>>,
    capture: Option<Capture>,
}

impl<B: MessageBody + 'static> ReplayBody<B> {
    fn plain(body: B) -> Self {
        ReplayBody {
            body: Some(Box::pin(body)),
            capture: None,
        }
    }

    fn capturing(body: B, capture: Capture) -> Self {
        ReplayBody {
            body: Some(Box::pin(body)),
            capture: Some(capture),
        }
    }
}

impl<B: MessageBody + 'static> fmt::Debug for ReplayBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReplayBody")
            .field("capturing", &self.capture.is_some())
            .finish_non_exhaustive()
    }
}

impl<B: MessageBody + 'static> Drop for ReplayBody<B> {
    fn drop(&mut self) {
        if let (Some(body), Some(capture)) = (self.body.take(), self.capture.take()) {
            if std::thread::panicking() {
                // Dropped while something unwinds: never poll user code now. Release,
                // store nothing.
                return;
            }
            actix_web::rt::spawn(drain(body, capture));
        }
    }
}

impl<B: MessageBody + 'static> MessageBody for ReplayBody<B> {
    type Error = B::Error;

    fn size(&self) -> BodySize {
        self.body.as_ref().map_or(BodySize::Sized(0), |b| b.size())
    }

    fn poll_next(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, Self::Error>>> {
        let this = self.get_mut();
        let Some(body) = this.body.as_mut() else {
            return Poll::Ready(None);
        };
        let chunk = match panic::catch_unwind(AssertUnwindSafe(|| body.as_mut().poll_next(cx))) {
            Ok(poll) => std::task::ready!(poll),
            Err(panic) => {
                // Never poll a panicked body again (not even from the drop's drain).
                this.body = None;
                this.capture = None;
                panic::resume_unwind(panic)
            }
        };
        match &chunk {
            Some(Ok(data)) => {
                if let Some(capture) = this.capture.as_mut() {
                    capture.data(data);
                }
            }
            None => {
                this.body = None;
                if let Some(capture) = this.capture.take() {
                    // Begun here (an in-process store writes on the spot), finished on
                    // the engine's runtime.
                    drop(capture.finish());
                }
            }
            // A body that fails stores nothing: the retry runs again.
            Some(Err(_)) => {
                this.body = None;
                drop(this.capture.take());
            }
        }
        Poll::Ready(chunk)
    }
}
