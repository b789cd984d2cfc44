//! Idempotency with response replay: the [`IdempotencyLayer`], after the IETF
//! Idempotency-Key draft and Stripe's behaviour.
//!
//! [`IdempotencyLayer::builder`] builds it (behind the default `idempotency` feature), once
//! told whose requests share records: per principal, by a scope the server derives, or
//! explicitly unscoped (see [`IdempotencyLayerBuilder::per_principal`]). It locks as a
//! [`LockLayer`](crate::LockLayer) does, with the same lock settings by the same names. For each `POST` and `PATCH`
//! (by default) with an `Idempotency-Key` header, the layer:
//!
//! 1. reads the request body (at most 1 MiB by default, else `413`) and fingerprints the
//!    request (SHA-256 over the method, the full original target, every value of the
//!    content type and the chosen headers, and the body; **not the host** by default, so
//!    that a retry on another node or address of the service is replayed);
//! 2. looks for the key's record within the scope: a completed request with the same
//!    fingerprint is **replayed** (its status, headers and body, plus
//!    `Idempotent-Replayed: true`), one with a different fingerprint is answered **`422`**;
//! 3. otherwise locks the key: a duplicate of a request in flight is answered **`409`**
//!    with `Retry-After`, or, with a `wait`, waits and then receives the replay;
//! 4. runs the handler and captures its response as it streams to the client; when the
//!    body is complete, the record is stored **in the same atomic step that releases the
//!    lock**, so no retry ever sees the key free without the record.
//!
//! **Virtual-host tenants need a host scope.** Records are shared by every host the layer
//! is in front of: an unscoped layer serving `a.example` and `b.example` replays
//! `a.example`'s stored response to `b.example`'s request with the same key. Where host
//! names select tenants or resources, scope the keys by the host
//! ([`scope_by(AuthorityKey::new())`](crate::key::AuthorityKey), which reads HTTP/2's
//! `:authority` too), or at least count it in the fingerprint
//! ([`fingerprint_authority`](IdempotencyLayerBuilder::fingerprint_authority): the other
//! host's request is then a `422`, not a replay).
//!
//! A client that disconnects does not cancel the request: the handler runs to completion,
//! the response is stored (its body read for at most
//! [`max_drain_time`](IdempotencyLayerBuilder::max_drain_time)), then the key is released.
//! Answers whose status means "try again" are never stored (`408`, `409`, `423`, `425`,
//! `429`, `5xx`; a `Retry-After` counts only on those, so a `202` with one is stored), nor
//! is anything marked [`NotStored`] (and by default not `400`, `401`, `403`, `407`,
//! `413`, `415`, `422`), nor are handler errors, panics and
//! bodies that fail: the retry runs again. A gRPC response (HTTP `200` whatever happened)
//! is judged by its `grpc-status` the same way: `CANCELLED`, `DEADLINE_EXCEEDED`,
//! `RESOURCE_EXHAUSTED`, `ABORTED` and `UNAVAILABLE` are never stored, `UNKNOWN`,
//! `UNIMPLEMENTED`, `INTERNAL` and `DATA_LOSS` are server errors, and by default not
//! `INVALID_ARGUMENT`, `FAILED_PRECONDITION`, `OUT_OF_RANGE`, `PERMISSION_DENIED`,
//! `UNAUTHENTICATED`. A gRPC status sent in the trailers (every call that answers a
//! message) decides there, and the trailers are stored with the response and replayed after
//! its body (as any response's trailers), whatever the body's size: a "try again" in the
//! trailers of a stream over the limit is not recorded either. A gRPC response cut off
//! before its trailers (its body failed, or its client left and the drain ran out) has no
//! status and is not recorded: its retry runs. A gRPC-Web response
//! (`application/grpc-web…`) is judged by a `grpc-status` in its head (a trailers-only
//! answer); one whose status is in a trailer frame at the end of its body, which the layer
//! does not read, is never stored: its retry runs again. Any other response over the limits is
//! recorded as completed but not stored: a retry gets `409` `response-not-stored`, never a
//! second run. Records are kept for 24 hours by
//! default. If the process running a request dies, its lease expires after its TTL and
//! a retry runs again: at-least-once, not exactly-once.
//!
//! ```
//! use std::{fmt, time::Duration};
//! use tower_lock::{IdempotencyLayer, LockEngine};
//!
//! /// Put in the request extensions by the application's authentication layer.
//! #[derive(Clone)]
//! struct AccountId(u64);
//!
//! impl fmt::Display for AccountId {
//!     fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
//!         write!(f, "{}", self.0)
//!     }
//! }
//!
//! let layer = IdempotencyLayer::builder(LockEngine::in_memory())
//!     .per_principal::<AccountId>()
//!     .wait(Duration::from_secs(10)) // duplicates wait for the first, then get its replay
//!     .retention(Duration::from_secs(6 * 60 * 60))
//!     .build()
//!     .unwrap();
//! let app = axum::Router::<()>::new()
//!     .route("/orders", axum::routing::post(|| async { (http::StatusCode::CREATED, "order 1") }))
//!     .route_layer(layer);
//! # let _ = app;
//! ```

mod adapter;
mod builder;
mod future;
mod http_chunks;
mod layer;
mod replay_body;
mod request_body;
mod service;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub mod transactional;

pub use builder::IdempotencyLayerBuilder;
pub use future::ResponseFuture;
pub use layer::IdempotencyLayer;
pub use replay_body::ReplayBody;
pub use request_body::RequestBody;
pub use service::IdempotencyService;
pub use tower_lock_core::{FingerprintFn, NotStored};
