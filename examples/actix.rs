//! The demo's guards on actix-web, with the native actix middleware from
//! `tower-lock-actix`: the same engine, key policy, statuses and problem+json bodies as
//! the tower layer.
//!
//! - `POST /orders`: Idempotency-Key required (`400`), scoped per signed-in account
//!   (`Authorization: Bearer <account>`, `401` without one), a duplicate in flight is
//!   `409`, a retry after completion is replayed, the same key with another body is
//!   `422`, and another account's same key runs its own order.
//! - `POST /tenants/{id}/jobs`: one at a time per tenant, wait up to 1 s, then `429`.
//! - `POST /tenants/{id}/import`: one at a time per tenant, no waiting: `423`.
//!
//! ```sh
//! cargo run --example actix         # http://127.0.0.1:3001; PORT to change it
//! ```

mod common;

use std::{env, error::Error, time::Duration};

use actix_web::{
    App, HttpMessage, HttpResponse, HttpServer,
    body::{BoxBody, MessageBody},
    dev::{ServiceRequest, ServiceResponse},
    middleware::{self, Next},
    web,
};
use serde_json::json;
use tower_lock::{ConfigError, IdempotencyLayer, LockEngine, LockLayer, key};
use tower_lock_actix::{LockMiddleware, Locked, ReplayMiddleware, RouteKey};

/// The middlewares of the app, built once (outside `HttpServer::new`) so that every
/// worker thread locks on the same tables; cloned into each worker's app.
#[derive(Clone, Debug)]
pub(crate) struct Guards {
    orders: ReplayMiddleware,
    jobs: LockMiddleware,
    import: LockMiddleware,
    work: Duration,
}

impl Guards {
    /// The guards, locking on `engine`; every handler takes `work` to answer.
    pub(crate) fn new(engine: LockEngine, work: Duration) -> Result<Self, ConfigError> {
        Ok(Self {
            // Scoped per account: what `authenticate` (wrapped outside) put in actix's
            // extensions, reached through `http_request`. Without it (the authentication
            // middleware forgotten) the layer answers 500 and logs the fix.
            orders: IdempotencyLayer::builder(engine.clone())
                .scope_by(key::from_fn("account", |req| {
                    let req = tower_lock_actix::http_request(req)?;
                    req.extensions()
                        .get::<common::Account>()
                        .map(ToString::to_string)
                }))
                .build()?
                .try_into()?,
            // One lock per tenant and endpoint: the `id` matched in `/tenants/{id}/...`,
            // percent-decoded as `web::Path` decodes it (`acm%65` is `acme`).
            jobs: LockLayer::builder(engine.clone())
                .key(RouteKey::param("id"))
                .wait(Duration::from_secs(1))
                .fifo(true)
                .max_waiters(4)
                .build()?
                .try_into()?,
            import: LockLayer::builder(engine)
                .key(RouteKey::param("id"))
                .build()?
                .try_into()?,
            work,
        })
    }
}

/// The routes, each wrapped in its guard. Wrapping resources, not the whole app, keeps an
/// unknown path a 404.
pub(crate) fn routes(cfg: &mut web::ServiceConfig, guards: &Guards) {
    let work = guards.work;
    cfg.service(
        web::resource("/orders")
            .wrap(guards.orders.clone())
            // The last `wrap` runs first: authentication, then the idempotency layer.
            .wrap(middleware::from_fn(authenticate))
            .route(web::post().to(move |Locked(lease): Locked| async move {
                actix_web::rt::time::sleep(work).await;
                HttpResponse::Created().json(json!({
                    "lock": lease.key().as_str(),
                    "fence": lease.fence().get(),
                }))
            })),
    )
    .service(
        web::resource("/tenants/{id}/jobs")
            .wrap(guards.jobs.clone())
            .route(web::post().to(
                move |tenant: web::Path<String>, Locked(lease): Locked| async move {
                    actix_web::rt::time::sleep(work).await;
                    HttpResponse::Ok().json(json!({
                        "tenant": tenant.into_inner(),
                        "job": "done",
                        "fence": lease.fence().get(),
                        "waited_ms": lease.waited().as_millis() as u64,
                    }))
                },
            )),
    )
    .service(
        web::resource("/tenants/{id}/import")
            .wrap(guards.import.clone())
            .route(web::post().to(
                move |tenant: web::Path<String>, Locked(lease): Locked| async move {
                    actix_web::rt::time::sleep(work).await;
                    HttpResponse::Ok().json(json!({
                        "tenant": tenant.into_inner(),
                        "import": "done",
                        "fence": lease.fence().get(),
                    }))
                },
            )),
    );
}

/// The example's authentication: a request without a valid `Authorization: Bearer
/// <account>` is answered `401`; a signed-in one carries its [`common::Account`] in the
/// extensions, where the idempotency layer's scope reads it.
async fn authenticate(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<BoxBody>, actix_web::Error> {
    let authorization = req.headers().get("authorization").map(|v| v.as_bytes());
    let Some(account) = common::authenticate(authorization) else {
        let refused = HttpResponse::Unauthorized()
            .insert_header(("www-authenticate", "Bearer"))
            .finish();
        return Ok(req.into_response(refused));
    };
    req.extensions_mut().insert(account);
    Ok(next.call(req).await?.map_into_boxed_body())
}

#[actix_web::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let engine = common::engine_from_env().await;
    let work = env::var("WORK_MS")
        .ok()
        .and_then(|ms| ms.parse().ok())
        .map_or(Duration::from_secs(5), Duration::from_millis);
    let guards = Guards::new(engine, work)?;
    let server = HttpServer::new(move || App::new().configure(|cfg| routes(cfg, &guards)))
        .workers(4)
        .bind(common::listen_addr(3001))?;
    let addr = server.addrs()[0];
    println!(
        "tower-lock actix demo on http://{addr} (each handler takes {work:?}, 4 workers)\n\
         Try: curl -si -X POST http://{addr}/orders -H 'Authorization: Bearer alice' \
         -H 'Idempotency-Key: \"order-1\"' &\n     \
         sleep 0.2; curl -si -X POST http://{addr}/orders -H 'Authorization: Bearer alice' \
         -H 'Idempotency-Key: \"order-1\"'   # 409 while the first runs, its replay after"
    );
    server.run().await?;
    Ok(())
}
