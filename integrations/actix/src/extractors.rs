//! The extractors of the lease a handler runs under: [`Locked`] and [`LockFence`], failing
//! with [`LockNotInstalled`] (`500`) when the request holds no lock.

use std::{
    fmt,
    future::{Ready, ready},
};

use actix_web::{
    FromRequest, HttpMessage, HttpRequest, ResponseError, dev::Payload, http::StatusCode,
};
use tower_lock::{Fence, LeaseInfo};

/// Extracts the [`LeaseInfo`] of the lock the request holds: its key, fencing token, wait
/// time and lost signal.
///
/// Fails with [`LockNotInstalled`] (`500`) when the request holds no lock: the middleware
/// does not wrap this route, or it let the request pass unlocked (no key under
/// [`MissingKeyPolicy::PassThrough`](tower_lock::MissingKeyPolicy::PassThrough), or the
/// fail-open policy). Extract `Option<Locked>` where that is expected. Under a dry run
/// (`dry_run(true)`) it never fails for a request the layer would have locked, rejected or
/// made wait: that request carries a lease info holding nothing
/// ([`LeaseInfo::is_dry_run`]), so the handler answers as under the enforcing layer.
#[derive(Clone, Debug)]
pub struct Locked(pub LeaseInfo);

impl FromRequest for Locked {
    type Error = LockNotInstalled;
    type Future = Ready<Result<Self, Self::Error>>;

    fn from_request(req: &HttpRequest, _payload: &mut Payload) -> Self::Future {
        ready(
            req.extensions()
                .get::<LeaseInfo>()
                .cloned()
                .map(Locked)
                .ok_or(LockNotInstalled),
        )
    }
}

/// Extracts just the fencing token of the lock the request holds; pass it to the storage
/// the lock protects. Fails like [`Locked`].
#[derive(Clone, Copy, Debug)]
pub struct LockFence(pub Fence);

impl FromRequest for LockFence {
    type Error = LockNotInstalled;
    type Future = Ready<Result<Self, Self::Error>>;

    fn from_request(req: &HttpRequest, _payload: &mut Payload) -> Self::Future {
        ready(
            req.extensions()
                .get::<LeaseInfo>()
                .map(|info| Self(info.fence()))
                .ok_or(LockNotInstalled),
        )
    }
}

/// The request holds no lock: the middleware does not wrap this route, or let the request
/// pass unlocked. A server bug, answered `500 Internal Server Error`.
#[derive(Clone, Copy, Debug, Default)]
#[non_exhaustive]
pub struct LockNotInstalled;

impl fmt::Display for LockNotInstalled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(
            "the handler needs a lock, but the request holds none: is the tower-lock middleware wrapping this route, and does it lock this method? `GET`, `HEAD`, `OPTIONS` and `TRACE` pass unlocked unless named in `methods([..])` or `shared_for([..])`",
        )
    }
}

impl std::error::Error for LockNotInstalled {}

impl ResponseError for LockNotInstalled {
    fn status_code(&self) -> StatusCode {
        StatusCode::INTERNAL_SERVER_ERROR
    }
}
