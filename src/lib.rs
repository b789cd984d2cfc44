//! tower-lock: serialize HTTP handlers per key, on a shared lock engine.
//!
//! A [`LockLayer`] derives a lock key from each request (a header, the `Idempotency-Key`,
//! a tenant, the route, a closure: see [`key`]), takes a lease on it from a
//! [`LockEngine`] (Redis for a fleet, in-process for one node), runs the inner service
//! while holding it, and releases it when the response body is finished or the client
//! goes away. Concurrent requests for one key wait their turn (optionally in arrival
//! order) or are turned away with `423 Locked` / `429 Too Many Requests` and
//! `Retry-After`, as `application/problem+json` ([`reject`]).
//!
//! # With axum
//!
//! ```
//! use std::time::Duration;
//! use axum::{Extension, Router, body::Body, http::{Request, StatusCode}, routing::post};
//! use tower::ServiceExt;
//! use tower_lock::{LeaseInfo, LockEngine, LockLayer, key::HeaderKey};
//!
//! async fn rebuild(Extension(lease): Extension<LeaseInfo>) -> String {
//!     // Hand the fencing token to the storage the lock protects.
//!     format!("rebuilt {} under fence {}", lease.key(), lease.fence())
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let engine = LockEngine::in_memory(); // or the Redis engine, shared by every node
//! let lock = LockLayer::builder(engine)
//!     .key(HeaderKey::new("x-tenant-id"))
//!     .wait(Duration::from_secs(2)) // queue up to 2 s, then 429
//!     .fifo(true)
//!     .build()?;
//! // `route_layer`: only matched routes take locks, so a 404 stays a 404.
//! let app = Router::new().route("/rebuild", post(rebuild)).route_layer(lock);
//!
//! let req = Request::post("/rebuild").header("x-tenant-id", "acme").body(Body::empty())?;
//! assert_eq!(app.clone().oneshot(req).await?.status(), StatusCode::OK);
//! let no_key = Request::post("/rebuild").body(Body::empty())?;
//! assert_eq!(app.oneshot(no_key).await?.status(), StatusCode::BAD_REQUEST);
//! # Ok(())
//! # }
//! ```
//!
//! The `tower-lock-axum` crate adds a `Locked` extractor and route-aware keys
//! (`RouteKey::params()`: one request at a time per `/tenants/{id}`).
//!
//! # With any tower service
//!
//! Idempotency with response replay ([`IdempotencyLayer`], feature `idempotency`, on by
//! default), on a plain tower service:
//!
//! ```
//! use std::convert::Infallible;
//! use http::{Request, Response, StatusCode};
//! use http_body_util::BodyExt;
//! use tower::{ServiceBuilder, ServiceExt, service_fn};
//! use tower_lock::{IdempotencyLayer, LockEngine, idempotency::RequestBody};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let layer = IdempotencyLayer::builder(LockEngine::in_memory()).unscoped().build()?;
//! let service = ServiceBuilder::new()
//!     .layer(layer.clone())
//!     // The inner service gets the request body the layer read to fingerprint it.
//!     .service(service_fn(|_req: Request<RequestBody<String>>| async {
//!         Ok::<_, Infallible>(Response::new("charged".to_owned()))
//!     }));
//!
//! let charge = || Request::post("/charges").header("idempotency-key", "\"8e03978e\"").body(String::new());
//! let res = service.clone().oneshot(charge()?).await?;
//! assert_eq!(res.status(), StatusCode::OK);
//! // Stored when the body has been produced in full (here: read by the caller).
//! assert_eq!(res.into_body().collect().await?.to_bytes(), "charged");
//! // The retry is answered with the stored response; the handler does not run again.
//! let retry = service.clone().oneshot(charge()?).await?;
//! assert_eq!(retry.headers()["idempotent-replayed"], "true");
//! let missing = service.oneshot(Request::post("/charges").body(String::new())?).await?;
//! assert_eq!(missing.status(), StatusCode::BAD_REQUEST);
//! assert_eq!(layer.metrics().snapshot().replayed, 1);
//! # Ok(())
//! # }
//! ```
//!
//! # Behaviour
//!
//! - **Contention.** Wait limit `0` (the default): a held key is answered `423` at once
//!   (`409` under the idempotency preset). A wait limit: the request waits (in arrival
//!   order with `fifo`), bounded by `max_waiters`; a wait that runs out or a full queue
//!   is answered `429`. `Retry-After` is the 95th percentile of the layer's recent hold
//!   times less what this node's holder already had, bounded by the holder's remaining
//!   lease: whole seconds, rounded to the nearest, never 0.
//! - **Methods.** By default every method but the safe ones (RFC 9110: `GET`, `HEAD`,
//!   `OPTIONS`, `TRACE`) takes the lock, so a CORS preflight or a status read passes
//!   unlocked; `methods([..])` locks exactly the methods it names (the idempotency
//!   preset: `POST` and `PATCH`).
//! - **No key.** [`MissingKeyPolicy`]: `400` (the default) or run unlocked.
//! - **Backend failure.** [`BackendFailurePolicy`]: `503` (the default), run unlocked,
//!   or lock on an in-process engine (per node). An outage is logged when it begins and
//!   ends, with a summary every 10 s while it lasts; each request only at `debug`.
//! - **Release.** [`ReleasePoint`]: when the response body ends or is dropped (the
//!   default), or when the response is ready. A response with no body to send (`204`,
//!   `304`, any answer to `HEAD`, an empty body) is released before its head is handed to
//!   the server, the release completed, so a client's next request never meets its own
//!   previous lease. A client that disconnects releases at once; a
//!   `101 Switching Protocols` response releases when it is returned.
//! - **Handlers** find a [`LeaseInfo`] (key, fencing token, wait time, lost signal) in the
//!   request extensions.
//! - **Observability.** `tracing` spans (`tower_lock.acquire`) and events for acquire,
//!   reject, release and lost leases; counters, histograms and gauges recorded through the
//!   `metrics` facade (feature `metrics`, see [`metrics`]), and a [`LockMetrics`] snapshot.
//! - **Other frameworks** run on the same framework-neutral core (the `tower-lock-core`
//!   crate), through [`key::RequestView`]; the tower services are thin shells over it.
//!
//! # The crate's parts
//!
//! Two middlewares, each in its own module, and what they share:
//!
//! - [`LockLayer`] ([`lock`]'s layer, builder, service, future and body) and
//!   [`IdempotencyLayer`] ([`idempotency`]);
//! - shared by both: [`key`] (key extractors), [`reject`] (rejections), [`metrics`], the
//!   option enums ([`MissingKeyPolicy`], [`BackendFailurePolicy`], [`ReleasePoint`]),
//!   [`ConfigError`], [`LeaseInfo`], [`NotStored`]; they come from `tower-lock-core`, the
//!   framework-neutral core both frameworks (tower and actix-web) run on.
//!
//! The [`engine`] module is the lock engine (Redis or in-process), the `tower-lock-engine`
//! crate re-exported; it knows nothing of HTTP.
//!
//! ```
//! use tower_lock::LockEngine;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tower_lock::LockError> {
//! let engine = LockEngine::in_memory();
//! let lease = engine.lock("tenant:7").acquire().await?;
//! assert!(engine.lock("tenant:7").locked().await?);
//! lease.release().await?;
//! # Ok(())
//! # }
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]

// The two middlewares.
#[cfg(feature = "idempotency")]
#[cfg_attr(docsrs, doc(cfg(feature = "idempotency")))]
pub mod idempotency;
pub mod lock;

// Fenced writes on Postgres, for either middleware.
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub mod fences;

mod accessors;
// What they share, from the framework-neutral core (the `tower-lock-core` crate), at the
// paths an application names them by.
mod setters;

#[cfg(feature = "postgres")]
pub use fences::{FenceError, FenceTable};
#[cfg(feature = "idempotency")]
pub use idempotency::{IdempotencyLayer, IdempotencyLayerBuilder};
pub use lock::{LockLayer, LockLayerBuilder, LockService, LockedBody, ResponseFuture};
pub use metrics::LockMetrics;
pub use reject::{Rejection, RejectionKind};
// What `LockLayer::locker()` returns and its `acquire` answers, nameable from here.
pub use tower_lock_core::{
    BackendFailurePolicy, ConfigError, LeaseInfo, MissingKeyPolicy, NotStored, Outcome,
    ReleasePoint, RequestLocker, key, metrics, reject,
};
/// The lock engine (the `tower-lock-engine` crate): leases on string keys, Redis or
/// in-process; it knows nothing of HTTP.
pub use tower_lock_engine as engine;
// The crates named by this one's API, at the versions it was built with: an application
// on a framework with another `http` (actix-web 4 speaks `http` 0.2) names them from here.
/// The `bytes` crate of this crate's API: the `Bytes` of rejection bodies, stored
/// responses and custom fingerprints.
pub use bytes;
/// The `http` crate (1.x) of this crate's API: `Method`, `HeaderName`, `Response`, as
/// [`on_reject`](LockLayerBuilder::on_reject) and the idempotency hooks take them.
pub use http;
/// sqlx, as the transactional idempotency layer uses it (the connection type handlers
/// borrow).
#[cfg(feature = "postgres")]
pub use sqlx;
pub use tower_lock_engine::{
    BackendError, BackendErrorKind, Fence, KeyError, Lease, Lock, LockEngine, LockError, LockKey,
    LockOptions, LostSignal, MemoryBackend, Token,
};

// The README's code blocks compile as doctests, so it cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
