//! The README's demo: an axum service with three guarded endpoints.
//!
//! - `POST /orders`: the Idempotency-Key preset, scoped per signed-in account
//!   (`Authorization: Bearer <account>`; the demo takes the token for the account's name,
//!   `401` without one). The key is required (`400` without it), a duplicate sent while
//!   the first is still running is answered `409 Conflict`, a retry after it completed
//!   gets the stored response replayed (`Idempotent-Replayed: true`, the handler does not
//!   run again), the same key with another body is `422`, and another account sending the
//!   same key runs its own order.
//! - `POST /tenants/{id}/jobs`: one job at a time per tenant; others wait up to 1 s in
//!   arrival order, then get `429 Too Many Requests`.
//! - `POST /tenants/{id}/import`: one import at a time per tenant, no waiting: `423 Locked`.
//!
//! ```sh
//! cargo run --example demo          # http://127.0.0.1:3000; PORT=8080 to change it
//! WORK_MS=500 cargo run --example demo     # handlers take 0.5 s instead of 5 s
//! REDIS_URL=redis://127.0.0.1/ cargo run --example demo   # lock on Redis
//! DATABASE_URL=postgres://app@127.0.0.1/app cargo run --features postgres --example demo
//! ```
//!
//! With `DATABASE_URL` (and the `postgres` feature), the locks and the stored responses
//! live in the schema `tower_lock` of that database, which the demo migrates on start.
//!
//! ```sh
//! ```
//!
//! It prints a curl session to try on start.

mod common;

use std::{env, error::Error, net::SocketAddr, time::Duration};

use axum::{
    Json, Router,
    extract::{Path, Request},
    http::{StatusCode, header},
    middleware::{self, Next},
    response::{IntoResponse, Response},
    routing::post,
};
use common::Account;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tower_lock::{ConfigError, IdempotencyLayer, LeaseInfo, LockEngine, LockLayer};
use tower_lock_axum::{Locked, RouteKey};

/// How long each handler works, unless `WORK_MS` says otherwise: long enough to race it
/// with a second curl by hand.
const WORK: Duration = Duration::from_secs(5);

/// The demo's router; every handler takes `work` to answer.
pub(crate) fn app(engine: LockEngine, work: Duration) -> Result<Router, ConfigError> {
    // Each layer is built once, here: every request it guards shares its lock table.
    // `route_layer`, not `layer`: an unknown path stays a 404 instead of taking a lock.
    let orders = Router::new()
        .route(
            "/orders",
            post(move |Locked(lease): Locked, order: String| async move {
                tokio::time::sleep(work).await;
                let order: Value = serde_json::from_str(&order).unwrap_or(Value::Null);
                (
                    StatusCode::CREATED,
                    Json(describe(&lease, json!({ "order": order }))),
                )
            }),
        )
        // Scoped per account: the records of one account are never replayed to another.
        .route_layer(
            IdempotencyLayer::builder(engine.clone())
                .per_principal::<Account>()
                // Until the layer has seen a hold, tell a contender a handler's time.
                .retry_after_fallback(work)
                .build()?,
        )
        // Authentication outside the idempotency layer, so the account is known to it.
        .layer(middleware::from_fn(authenticate));

    let jobs = Router::new()
        .route(
            "/tenants/{id}/jobs",
            post(
                move |Path(tenant): Path<String>, Locked(lease): Locked| async move {
                    tokio::time::sleep(work).await;
                    Json(describe(&lease, json!({ "tenant": tenant, "job": "done" })))
                },
            ),
        )
        .route_layer(
            LockLayer::builder(engine.clone())
                .key(RouteKey::param("id"))
                .wait(Duration::from_secs(1))
                .fifo(true)
                .max_waiters(4)
                .retry_after_fallback(work)
                .build()?,
        );

    let imports = Router::new()
        .route(
            "/tenants/{id}/import",
            post(
                move |Path(tenant): Path<String>, Locked(lease): Locked| async move {
                    tokio::time::sleep(work).await;
                    Json(describe(
                        &lease,
                        json!({ "tenant": tenant, "import": "done" }),
                    ))
                },
            ),
        )
        .route_layer(
            LockLayer::builder(engine)
                .key(RouteKey::param("id"))
                .retry_after_fallback(work)
                .build()?,
        );

    Ok(orders.merge(jobs).merge(imports))
}

/// The demo's authentication: the account named by `Authorization: Bearer <account>` goes
/// into the request extensions; a request without one is `401`.
async fn authenticate(mut req: Request, next: Next) -> Response {
    let authorization = req
        .headers()
        .get(header::AUTHORIZATION)
        .map(|v| v.as_bytes());
    match common::authenticate(authorization) {
        Some(account) => {
            req.extensions_mut().insert(account);
            next.run(req).await
        }
        None => (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            "sign in: Authorization: Bearer <account>\n",
        )
            .into_response(),
    }
}

/// `fields` plus what the handler knows of its lease. A real handler passes the fence to
/// the storage it writes, which refuses a fence lower than the last it saw.
fn describe(lease: &LeaseInfo, mut fields: Value) -> Value {
    fields["lock"] = lease.key().as_str().into();
    fields["fence"] = lease.fence().get().into();
    fields["waited_ms"] = (lease.waited().as_millis() as u64).into();
    fields
}

/// What to try once the demo listens on `addr`.
pub(crate) fn curl_hint(addr: SocketAddr, work: Duration) -> String {
    let base = format!("http://{addr}");
    let secs = work.as_secs() + 1;
    format!(
        "tower-lock demo on {base} (each handler takes {work:?})\n\
         Try, in another terminal:\n\
         \n  # 201, and 409 for the same Idempotency-Key while the first runs\
         \n  curl -si -X POST {base}/orders -H 'Authorization: Bearer alice' -H 'Idempotency-Key: \"order-1\"' -d '{{\"sku\":42}}' &\
         \n  sleep 0.2; curl -si -X POST {base}/orders -H 'Authorization: Bearer alice' -H 'Idempotency-Key: \"order-1\"' -d '{{\"sku\":42}}'\
         \n  # once the first is done, the same request is replayed (Idempotent-Replayed: true)\
         \n  sleep {secs}; curl -si -X POST {base}/orders -H 'Authorization: Bearer alice' -H 'Idempotency-Key: \"order-1\"' -d '{{\"sku\":42}}'\
         \n  # 422: the same key with another body; as bob: bob's own order (201)\
         \n  curl -si -X POST {base}/orders -H 'Authorization: Bearer alice' -H 'Idempotency-Key: \"order-1\"' -d '{{\"sku\":43}}'\
         \n  curl -si -X POST {base}/orders -H 'Authorization: Bearer bob' -H 'Idempotency-Key: \"order-1\"' -d '{{\"sku\":42}}'\
         \n  # 400: the key is required\
         \n  curl -si -X POST {base}/orders -H 'Authorization: Bearer alice'\
         \n  # 423: one import at a time per tenant, no waiting\
         \n  curl -si -X POST {base}/tenants/acme/import &\
         \n  sleep 0.2; curl -si -X POST {base}/tenants/acme/import\
         \n  # 429 after waiting 1 s; another tenant is not held up\
         \n  curl -si -X POST {base}/tenants/acme/jobs &\
         \n  sleep 0.2; curl -si -X POST {base}/tenants/acme/jobs; curl -si -X POST {base}/tenants/globex/jobs\n"
    )
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let engine = common::engine_from_env().await;
    let work = env::var("WORK_MS")
        .ok()
        .and_then(|ms| ms.parse().ok())
        .map_or(WORK, Duration::from_millis);
    let listener = TcpListener::bind(common::listen_addr(3000)).await?;
    println!("{}", curl_hint(listener.local_addr()?, work));
    axum::serve(listener, app(engine, work)?).await?;
    Ok(())
}
