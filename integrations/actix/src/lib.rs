//! actix-web integration for [tower-lock](tower_lock): a native actix middleware over the
//! same lock engine and the same request locker as the tower [`LockLayer`].
//!
//! actix-web 4 is not built on tower (and speaks `http` 0.2), so it gets its own
//! [`Transform`]: [`LockMiddleware`], made from a [`LockLayer`] (`build()?.try_into()?`), as
//! [`ReplayMiddleware`] is from an [`IdempotencyLayer`]. Making it fails for a key that
//! reads a principal from `http` extensions, which actix requests do not carry: scope by a
//! `key::from_fn` closure that reads actix's extensions through [`http_request`] instead
//! (it answers `500` and logs the fix when the principal is missing). Header names and methods are
//! given as text or as actix's own types (`actix_web::http::Method::POST`): no second
//! `http` crate is needed (tower-lock re-exports its own as `tower_lock::http`). It does no lock logic of its own. Each request is
//! shown to the framework-neutral [`RequestLocker`] through [`ActixRequest`], a
//! [`RequestView`] over actix's request head, and the locker's decision is mapped onto
//! actix types: the same key extractors, the same `400`/`409`/`423`/`429`/`503` statuses,
//! the same `Retry-After` and the same `application/problem+json` bodies as the tower
//! layer (or the layer's `on_reject` hook).
//!
//! - **One engine for all workers.** Build the engine and the middleware once, outside
//!   [`HttpServer::new`](actix_web::HttpServer::new), and clone them into the app
//!   factory. An in-process engine made inside the factory would give each worker its own
//!   lock table, and requests served by different workers would not exclude each other; a
//!   Redis or Postgres engine made there still excludes (the table is the server's) but
//!   opens connections, a watchdog and a listener per worker.
//! - **The lease lives until the body ends.** The response body is wrapped in
//!   [`LockedBody`], which owns the lease and drops it when the last chunk has been taken,
//!   when the body fails, or when actix drops the body (the client went away). A response
//!   with no body to send (`204`, `304`, any answer to `HEAD`, a body of size none or 0),
//!   which actix never polls, is released before it is handed to actix, the release
//!   completed, so a client's next request never meets its own previous lease.
//! - **Handlers see their lease** with the [`Locked`] and [`LockFence`] extractors.
//! - **A rejection keeps the connection.** actix closes a connection whose request body
//!   was left unread; before a rejection (`400`, `409`, `423`, `429`, `503`) the
//!   middleware reads and drops a body of up to 64 KiB (`content-length`), so the client's
//!   next request is served on the same connection, as under the tower layer. A larger
//!   body is not read, and actix closes that connection.
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
//!     let per_tenant: LockMiddleware = LockLayer::builder(LockEngine::in_memory())
//!         .key(HeaderKey::new("x-tenant-id"))
//!         .wait(Duration::from_secs(2)) // queue up to 2 s, then 429
//!         .fifo(true)
//!         .build()?
//!         .try_into()?;
//!     HttpServer::new(move || {
//!         App::new().service(
//!             // On the route, not the resource: a wrong method stays a 405.
//!             web::resource("/rebuild").route(web::post().to(rebuild).wrap(per_tenant.clone())),
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
//! use tower_lock::{IdempotencyLayer, LockEngine};
//! use tower_lock_actix::{LockMiddleware, Locked};
//!
//! # #[actix_web::main]
//! # async fn main() {
//! let engine = LockEngine::in_memory();
//! let lock = LockMiddleware::try_from(
//!     IdempotencyLayer::builder(engine.clone()).without_replay().build().unwrap(),
//! )
//! .unwrap();
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
//! # Permits
//!
//! The layer's [`permits`](tower_lock::LockLayerBuilder::permits) and
//! [`shared_for`](tower_lock::LockLayerBuilder::shared_for) work here as under the tower
//! layer (N requests per key at once; some methods sharing a key, the others alone), with
//! methods named as text or as actix's own `Method`:
//!
//! ```
//! use actix_web::http::Method;
//! use tower_lock::{LockEngine, LockLayer};
//! use tower_lock_actix::{LockMiddleware, RouteKey};
//!
//! // Reads of one document side by side; a PUT or DELETE waits for them and runs alone.
//! let documents: LockMiddleware = LockLayer::builder(LockEngine::in_memory())
//!     .key(RouteKey::param("id"))
//!     .shared_for([Method::GET, Method::HEAD])
//!     .build()
//!     .unwrap()
//!     .try_into()
//!     .unwrap();
//! assert!(documents.locker().locks_method("GET"));
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
//!
//! [`LockLayer`]: tower_lock::LockLayer
//! [`IdempotencyLayer`]: tower_lock::IdempotencyLayer
//! [`Transform`]: actix_web::dev::Transform
//! [`RequestLocker`]: tower_lock_core::RequestLocker
//! [`RequestView`]: tower_lock::key::RequestView

#![forbid(unsafe_code)]

mod body;
mod extractors;
mod http_conversion;
mod middleware;
// Gated once here; its public items are re-exported below.
#[cfg(feature = "idempotency")]
mod replay;
mod request;
mod route_key;
#[cfg(feature = "postgres")]
mod transactional;
mod unread_body;

pub use body::LockedBody;
pub use extractors::{LockFence, LockNotInstalled, Locked};
pub use middleware::{LockMiddleware, LockMiddlewareService};
#[cfg(feature = "idempotency")]
pub use replay::{ReplayBody, ReplayMiddleware, ReplayMiddlewareService};
pub use request::{ActixRequest, http_request};
pub use route_key::{ActixRoutes, RouteKey};
#[cfg(feature = "postgres")]
pub use transactional::{
    FenceRejection, TransactionalMiddleware, TransactionalMiddlewareService, Tx, TxRejection,
};

// The README's code blocks compile as doctests, so it cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
