//! [`ReplayMiddleware`]: idempotency replay on actix-web, over the same framework-neutral
//! [`ReplayLocker`] as the tower [`IdempotencyLayer`]: the core drives each request, the
//! actix adapter reads its body, calls the service and converts the responses.

mod adapter;
mod body;

use std::{
    fmt,
    future::{Ready, ready},
    rc::Rc,
};

use actix_web::{
    Error,
    body::{EitherBody, MessageBody},
    dev::{Service, ServiceRequest, ServiceResponse, Transform},
};
use tower_lock::{ConfigError, IdempotencyLayer, LockMetrics};
use tower_lock_core::{ReplayFuture, ReplayLocker};

use adapter::ActixAdapter;
pub use body::ReplayBody;

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
    type Future = ReplayFuture<ActixAdapter<S, B>>;

    actix_web::dev::forward_ready!(service);

    fn call(&self, req: ServiceRequest) -> Self::Future {
        self.replay
            .serve(ActixAdapter::new(Rc::clone(&self.service), req))
    }
}
