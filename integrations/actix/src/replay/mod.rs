//! [`ReplayMiddleware`]: idempotency replay on actix-web, over the same framework-neutral
//! [`ReplayLocker`] as the tower [`IdempotencyLayer`].

mod body;

use std::{
    fmt,
    future::{Ready, ready},
    rc::Rc,
};

use actix_web::{
    Error, FromRequest, HttpMessage,
    body::{BodySize, EitherBody, MessageBody},
    dev::{Payload, Service, ServiceRequest, ServiceResponse, Transform},
    web,
};
use tower_lock::{ConfigError, IdempotencyLayer, LockMetrics};
use tower_lock_core::{KeepRunning, ReplayDecision, ReplayLocker};

pub use body::ReplayBody;
use body::{Handled, spawn};

use crate::{
    ActixRequest, http_conversion::to_actix_response, middleware::LocalBoxFuture,
    unread_body::discard_small_body,
};

/// Idempotency with response replay for actix-web: the actix counterpart of
/// [`IdempotencyLayer`], with the same semantics (see [`tower_lock::idempotency`]).
///
/// Build it once, outside the `HttpServer::new` app factory (every worker must share its
/// records and locks), and wrap the resources that create things:
///
/// ```
/// use actix_web::{App, HttpResponse, web};
/// use tower_lock::{IdempotencyLayer, LockEngine};
/// use tower_lock_actix::ReplayMiddleware;
///
/// let replay = ReplayMiddleware::try_from(
///     IdempotencyLayer::builder(LockEngine::in_memory()).unscoped().build().unwrap(),
/// )
/// .unwrap();
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
    /// The middleware's counters and histograms (replays included).
    pub fn metrics(&self) -> LockMetrics {
        self.replay.locker().metrics()
    }
}

/// Shares the layer's records and locks: a tower service and an actix app built from one
/// layer replay each other's responses. A layer scoped
/// [`per_principal`](tower_lock::IdempotencyLayerBuilder::per_principal) is refused
/// ([`ConfigError::NeedsExtensions`]): actix requests carry no `http` extensions to find
/// the principal in; scope by a header instead.
impl TryFrom<IdempotencyLayer> for ReplayMiddleware {
    type Error = ConfigError;

    fn try_from(layer: IdempotencyLayer) -> Result<Self, ConfigError> {
        Self::try_from(&layer)
    }
}

impl TryFrom<&IdempotencyLayer> for ReplayMiddleware {
    type Error = ConfigError;

    fn try_from(layer: &IdempotencyLayer) -> Result<Self, ConfigError> {
        let replay = layer.replay_locker();
        replay.locker().check_without_extensions()?;
        Ok(Self {
            replay: replay.clone(),
        })
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
                Err(rejection) => {
                    discard_small_body(&mut req).await;
                    return reject(req, rejection);
                }
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
                ReplayDecision::Replay(res) => Ok(req
                    .into_response(to_actix_response(res))
                    .map_into_right_body()),
                ReplayDecision::Rejected(rejection) => reject(req, rejection),
                ReplayDecision::Unlocked => {
                    req.set_payload(Payload::from(data));
                    let res = service.call(req).await?;
                    Ok(res.map_body(|_, b| EitherBody::left(ReplayBody::plain(b))))
                }
                ReplayDecision::Run(completion) => {
                    req.set_payload(Payload::from(data));
                    req.extensions_mut().insert(completion.info().clone());
                    let handler = service.call(req);
                    let handler = async move { handler.await.map(Handled) };
                    // A handler error drops the completion: released, nothing stored.
                    let (handled, completion) =
                        KeepRunning::new(handler, completion, spawn).await?;
                    let capture = completion.capture_response(&handled);
                    let Handled(res) = handled;
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
