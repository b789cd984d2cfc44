//! [`LockMiddleware`]: the tower-lock middleware for actix-web, a [`Transform`] over the
//! framework-neutral [`RequestLocker`], and the service it wraps around an actix service.

use std::{
    fmt,
    future::{Future, Ready, ready},
    pin::Pin,
    rc::Rc,
};

use actix_web::{
    Error, HttpMessage,
    body::{BodySize, EitherBody, MessageBody},
    dev::{Service, ServiceRequest, ServiceResponse, Transform},
    http::Method,
};
use tower_lock::{ConfigError, LockLayer, LockMetrics};
use tower_lock_core::{AfterHead, Outcome, RequestLocker};

use crate::{
    ActixRequest, LockedBody, http_conversion::to_actix_response, unread_body::discard_small_body,
};

/// The tower-lock middleware for actix-web: a [`Transform`] that serializes the wrapped
/// service per lock key, as configured by a [`LockLayer`]'s builder.
///
/// Made one way: `LockLayer::builder(engine)…build()?.try_into()?` (or
/// `LockMiddleware::try_from(&layer)?`, which shares the layer's locks with its tower
/// services); it fails with [`ConfigError::NeedsExtensions`] for a principal-scoped key.
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
    /// The framework-neutral runtime core the middleware locks with.
    pub fn locker(&self) -> &RequestLocker {
        &self.locker
    }

    /// The middleware's counters and histograms.
    pub fn metrics(&self) -> LockMetrics {
        self.locker.metrics()
    }
}

/// The middleware shares the layer's locker: a tower service and an actix app built from
/// one layer exclude each other. A layer keyed by a principal from the request's `http`
/// extensions is refused ([`ConfigError::NeedsExtensions`]): actix requests carry none.
impl TryFrom<LockLayer> for LockMiddleware {
    type Error = ConfigError;

    fn try_from(layer: LockLayer) -> Result<Self, ConfigError> {
        Self::try_from(&layer)
    }
}

impl TryFrom<&LockLayer> for LockMiddleware {
    type Error = ConfigError;

    fn try_from(layer: &LockLayer) -> Result<Self, ConfigError> {
        layer.locker().check_without_extensions()?;
        Ok(Self {
            locker: layer.locker().clone(),
        })
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

/// The boxed future of an actix service call (actix services run on one thread).
pub(crate) type LocalBoxFuture<T> = Pin<Box<dyn Future<Output = T> + 'static>>;

impl<S, B> Service<ServiceRequest> for LockMiddlewareService<S>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = Error> + 'static,
    B: MessageBody + 'static,
{
    type Response = ServiceResponse<EitherBody<LockedBody<B>>>;
    type Error = Error;
    type Future = LocalBoxFuture<Result<Self::Response, Self::Error>>;

    actix_web::dev::forward_ready!(service);

    fn call(&self, mut req: ServiceRequest) -> Self::Future {
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
                // A dry run's request it would have rejected: unlocked, with its lease
                // info, so the handler's extractors answer as under the enforcing layer.
                Outcome::Observed(info) => {
                    req.extensions_mut().insert(info);
                    None
                }
                Outcome::Rejected(rejection) => {
                    let response =
                        to_actix_response(locker.respond(rejection, &ActixRequest::from(&req)));
                    discard_small_body(&mut req).await;
                    return Ok(req.into_response(response).map_into_right_body());
                }
            };
            let response = service.call(req).await?;
            let held = match held {
                None => None,
                Some(held) => {
                    // actix never polls a body it must not send.
                    let empty = matches!(
                        response.response().body().size(),
                        BodySize::None | BodySize::Sized(0)
                    );
                    match held.after_head(response.status().as_u16(), head || empty) {
                        AfterHead::Released => None,
                        AfterHead::ReleaseFirst(release) => {
                            release.await;
                            None
                        }
                        AfterHead::HoldUntilBodyEnd(held) => Some(held),
                    }
                }
            };
            Ok(response.map_body(|_, body| EitherBody::left(LockedBody::new(body, held))))
        })
    }
}
