//! [`TransactionalMiddleware`]: tower-lock's transactional idempotency on actix-web, over
//! the same protocol steps as the tower layer (feature `postgres`), and the [`Tx`]
//! extractor of the request's transaction.

mod keep_running;
mod prefixed_body;
mod tx;

use std::{
    fmt,
    future::{Ready, poll_fn, ready},
    pin::Pin,
    rc::Rc,
};

use actix_web::{
    Error, HttpMessage,
    body::{BoxBody, EitherBody, MessageBody},
    dev::{Payload, Service, ServiceRequest, ServiceResponse, Transform},
};
use bytes::{Bytes, BytesMut};
use futures_core::Stream;
use tower_lock::{
    ConfigError, LockMetrics, NotStored,
    idempotency::transactional::{Coverage, RunsOn, Settled, TransactionalLayer},
};

use crate::{
    ActixRequest,
    http_conversion::{http_headers, to_actix_response},
    middleware::LocalBoxFuture,
    unread_body::discard_small_body,
};
use keep_running::KeepRunning;
use prefixed_body::PrefixedBody;
pub use tx::{FenceRejection, Tx, TxRejection};

/// Exactly once for database writes on actix-web: the actix counterpart of
/// [`TransactionalLayer`], with the same semantics (see
/// [`tower_lock::idempotency::transactional`]); handlers take the request's transaction
/// with [`Tx`]. Build the layer once, outside the `HttpServer::new` app factory, and wrap
/// the resources that write:
///
/// ```no_run
/// use actix_web::{App, HttpResponse, web};
/// use tower_lock::{IdempotencyLayer, LockEngine, sqlx::PgPool};
/// use tower_lock_actix::{TransactionalMiddleware, Tx};
///
/// async fn pay(mut tx: Tx, body: String) -> HttpResponse {
///     let inserted = tower_lock::sqlx::query("INSERT INTO payments (note) VALUES ($1)")
///         .persistent(false)
///         .bind(body)
///         .execute(&mut *tx)
///         .await;
///     match inserted {
///         Ok(_) => HttpResponse::Created().finish(),
///         Err(_) => HttpResponse::ServiceUnavailable().finish(),
///     }
/// }
///
/// # async fn run(pool: PgPool) -> Result<(), Box<dyn std::error::Error>> {
/// let layer = IdempotencyLayer::builder(LockEngine::in_memory())
///     .unscoped()
///     .transactional(pool)
///     .build()
///     .await?;
/// let middleware = TransactionalMiddleware::try_from(layer)?;
/// let app = App::new().service(web::resource("/payments").wrap(middleware).route(web::post().to(pay)));
/// # let _ = app;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct TransactionalMiddleware {
    layer: TransactionalLayer,
}

impl TransactionalMiddleware {
    /// The middleware's counters (replays and rejections).
    pub fn metrics(&self) -> LockMetrics {
        self.layer.metrics()
    }
}

/// Shares the layer's pool and records table. A layer scoped
/// [`per_principal`](tower_lock::IdempotencyLayerBuilder::per_principal) is refused
/// ([`ConfigError::NeedsExtensions`]): actix requests carry no `http` extensions to find
/// the principal in; scope by a header instead.
impl TryFrom<TransactionalLayer> for TransactionalMiddleware {
    type Error = ConfigError;

    fn try_from(layer: TransactionalLayer) -> Result<Self, ConfigError> {
        layer.replay_locker().locker().check_without_extensions()?;
        Ok(Self { layer })
    }
}

impl<S, B> Transform<S, ServiceRequest> for TransactionalMiddleware
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = Error> + 'static,
    B: MessageBody + 'static,
{
    type Response = ServiceResponse<EitherBody<B>>;
    type Error = Error;
    type Transform = TransactionalMiddlewareService<S>;
    type InitError = ();
    type Future = Ready<Result<Self::Transform, Self::InitError>>;

    fn new_transform(&self, service: S) -> Self::Future {
        ready(Ok(TransactionalMiddlewareService {
            service: Rc::new(service),
            layer: self.layer.clone(),
        }))
    }
}

/// The service [`TransactionalMiddleware`] wraps around an actix service (one per worker).
pub struct TransactionalMiddlewareService<S> {
    service: Rc<S>,
    layer: TransactionalLayer,
}

impl<S> fmt::Debug for TransactionalMiddlewareService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TransactionalMiddlewareService")
            .field("layer", &self.layer)
            .finish_non_exhaustive()
    }
}

/// The layer's own answer (a replay, a rejection) to `req`.
fn answer<B>(req: ServiceRequest, answer: http::Response<Bytes>) -> ServiceResponse<EitherBody<B>> {
    req.into_response(to_actix_response(answer))
        .map_into_right_body()
}

/// The whole request body, at most `max` bytes: `Err(true)` over it, `Err(false)` for a
/// body that failed.
async fn read_payload(payload: &mut Payload, max: usize) -> Result<Bytes, bool> {
    let mut bytes = BytesMut::new();
    while let Some(chunk) = poll_fn(|cx| Pin::new(&mut *payload).poll_next(cx)).await {
        let Ok(chunk) = chunk else { return Err(false) };
        if bytes.len() + chunk.len() > max {
            return Err(true);
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(bytes.freeze())
}

impl<S, B> Service<ServiceRequest> for TransactionalMiddlewareService<S>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = Error> + 'static,
    B: MessageBody + 'static,
{
    type Response = ServiceResponse<EitherBody<B>>;
    type Error = Error;
    type Future = LocalBoxFuture<Result<Self::Response, Self::Error>>;

    actix_web::dev::forward_ready!(service);

    fn call(&self, mut req: ServiceRequest) -> Self::Future {
        let service = Rc::clone(&self.service);
        let layer = self.layer.clone();
        let runs_on = RunsOn::new();
        let running = runs_on.clone();
        Box::pin(KeepRunning::new(
            async move {
                let key = match layer.covers(&ActixRequest::from(&req)) {
                    Coverage::Covered(key) => key,
                    Coverage::Passed => return Ok(service.call(req).await?.map_into_left_body()),
                    Coverage::Refused(refused) => {
                        // actix closes a connection whose request body was left unread.
                        discard_small_body(&mut req).await;
                        return Ok(answer(req, refused));
                    }
                };
                let mut payload = req.take_payload();
                let body = match read_payload(&mut payload, layer.max_request_body()).await {
                    Ok(body) => body,
                    Err(too_large) => {
                        let refused = layer.refuse_body(too_large, &ActixRequest::from(&req));
                        return Ok(answer(req, refused));
                    }
                };
                let pending = layer.pending(&ActixRequest::from(&req), key, &body);
                let claimed = match pending.claim().await {
                    Ok(claimed) => claimed,
                    Err(refused) => return Ok(answer(req, refused)),
                };
                req.set_payload(Payload::from(body));
                req.extensions_mut().insert(claimed.lent());
                // From here a client that leaves does not cancel the request (`KeepRunning`);
                // an error or a panic drops the transaction: rolled back.
                running.begin();
                let res = service.call(req).await?;
                let status = http::StatusCode::from_u16(res.status().as_u16())
                    .unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR);
                let marked = res.response().extensions().get::<NotStored>().is_some();
                let headers = http_headers(res.headers());
                let storing = match claimed.settle(status, &headers, marked).await {
                    Settled::RolledBack => return Ok(res.map_into_left_body()),
                    Settled::Refused(refused) => {
                        let (req, _) = res.into_parts();
                        return Ok(ServiceResponse::new(req, to_actix_response(refused))
                            .map_into_right_body());
                    }
                    Settled::Store(storing) => storing,
                };
                let (req, response) = res.into_parts();
                let (head, body) = response.into_parts();
                let mut body = Box::pin(body);
                let mut bytes = BytesMut::new();
                let read = async {
                    loop {
                        match poll_fn(|cx| body.as_mut().poll_next(cx)).await {
                            Some(Ok(chunk)) => {
                                bytes.extend_from_slice(&chunk);
                                if bytes.len() > storing.max_body() {
                                    break Some(true);
                                }
                            }
                            Some(Err(_)) => break None,
                            None => break Some(false),
                        }
                    }
                };
                let over = match running
                    .unless_gone_for(storing.max_drain_time(), read)
                    .await
                {
                    Some(Some(over)) => over,
                    Some(None) => {
                        let refused = storing.abandon().await;
                        return Ok(ServiceResponse::new(req, to_actix_response(refused))
                            .map_into_right_body());
                    }
                    // Its client left and the body did not end within the drain time:
                    // completed, not stored (a retry gets `409 response-not-stored`).
                    None => true,
                };
                let bytes = bytes.freeze();
                let (stored, sent) = if over {
                    (None, PrefixedBody::new(bytes, body).boxed())
                } else {
                    (Some(bytes.clone()), BoxBody::new(bytes))
                };
                // actix-web's response bodies carry no trailers: a gRPC response whose
                // status was not in its head is never seen with one, so it rolls back
                // (the core's rule for a status nobody can read), nothing recorded.
                if let Err(refused) = storing.commit(stored, None).await {
                    return Ok(
                        ServiceResponse::new(req, to_actix_response(refused)).map_into_right_body()
                    );
                }
                Ok(ServiceResponse::new(req, head.set_body(sent)).map_into_right_body())
            },
            runs_on,
        ))
    }
}
