//! axum integration for [tower-lock](tower_lock): extractors for the lease a handler runs
//! under, and lock keys derived from the matched route and its path parameters.
//!
//! One request at a time per tenant, in one line:
//!
//! ```
//! use axum::{Router, routing::post};
//! use tower_lock::{LockEngine, LockLayer};
//! use tower_lock_axum::{Locked, RouteKey};
//!
//! async fn rebuild(Locked(lease): Locked) -> String {
//!     format!("rebuilding under fence {}", lease.fence())
//! }
//!
//! # fn main() -> Result<(), tower_lock::ConfigError> {
//! let engine = LockEngine::in_memory();
//! let app: Router = Router::new()
//!     .route("/tenants/{id}/rebuild", post(rebuild))
//!     .route_layer(LockLayer::builder(engine).key(RouteKey::params()).build()?);
//! # let _ = app;
//! # Ok(())
//! # }
//! ```
//!
//! # Permits
//!
//! N requests per key at once ([`permits`](tower_lock::LockLayerBuilder::permits)), or
//! reads side by side and each write alone
//! ([`shared_for`](tower_lock::LockLayerBuilder::shared_for)), on the same routes:
//!
//! ```
//! use std::time::Duration;
//! use axum::{Router, http::Method, routing::get};
//! use tower_lock::{LockEngine, LockLayer};
//! use tower_lock_axum::RouteKey;
//!
//! # fn main() -> Result<(), tower_lock::ConfigError> {
//! let documents = LockLayer::builder(LockEngine::in_memory())
//!     .key(RouteKey::param("id"))
//!     .shared_for([Method::GET, Method::HEAD])
//!     .wait(Duration::from_secs(5))
//!     .build()?;
//! let app: Router = Router::new()
//!     .route("/documents/{id}", get(|| async { "read" }).put(|| async { "written" }))
//!     .route_layer(documents);
//! # let _ = app;
//! # Ok(())
//! # }
//! ```
//!
//! # `route_layer`, not `layer`
//!
//! Install the lock with [`Router::route_layer`](axum::Router::route_layer). It then runs
//! only for requests that matched a route, after routing, so a request for an unknown path
//! stays a `404`. ([`MatchedPath`], which [`RouteKey`] reads, is there under
//! [`Router::layer`](axum::Router::layer) too: axum 0.8 sets it before the route's layers
//! run.)
//!
//! A wrong method on a matched path is axum's `405`, answered by the route's method router,
//! and `route_layer` wraps that answer too: a `PUT` to a `POST`-only route would meet the
//! lock (`400` without a key, `423` while a `POST` holds it), and the layer cannot tell it
//! from a routed `PUT`. So end the router with
//! [`method_not_allowed_fallback`](axum::Router::method_not_allowed_fallback), which puts
//! the `405` back outside the lock, or install the lock on each method router
//! ([`MethodRouter::route_layer`](axum::routing::MethodRouter::route_layer), which wraps
//! its methods only):
//!
//! ```
//! use axum::{Router, http::StatusCode, routing::post};
//! use tower_lock::{LockEngine, LockLayer};
//! use tower_lock_axum::RouteKey;
//!
//! # fn main() -> Result<(), tower_lock::ConfigError> {
//! let lock = || LockLayer::builder(LockEngine::in_memory()).key(RouteKey::params()).build();
//! let app: Router = Router::new()
//!     .route("/tenants/{id}/rebuild", post(|| async { "rebuilt" }))
//!     .route_layer(lock()?)
//!     .method_not_allowed_fallback(|| async { StatusCode::METHOD_NOT_ALLOWED });
//! // Or per method router.
//! let same: Router = Router::new()
//!     .route("/tenants/{id}/rebuild", post(|| async { "rebuilt" }).route_layer(lock()?));
//! # let _ = (app, same);
//! # Ok(())
//! # }
//! ```
//!
//! [`Router::layer`](axum::Router::layer) also wraps the router's fallback. A request that
//! matched no route (axum put no [`MatchedPath`] in it) is not the layer's, whatever its
//! key: it passes through unlocked, so it stays a `404`, and the first is logged
//! (`warn`) with `route_layer` as the fix. Note that `route_layer` wraps every route
//! added before it, and only those. A service mounted with
//! [`Router::nest_service`](axum::Router::nest_service) has no [`MatchedPath`] either
//! (axum gives no public sign that tells it from the fallback), so a lock around it, or
//! on it, lets it pass unlocked too: mount a service you lock with
//! [`Router::route_service`](axum::Router::route_service)`("/prefix/{*rest}", service)`
//! (the service then sees the whole path, prefix included).
//!
//! # One key across routes
//!
//! A [`RouteKey`] names its route, so two routes never share a key; to lock a tenant
//! across `GET /tenants/{id}/report` and `POST /tenants/{id}/reindex`, key on the
//! parameter alone with [`across_routes`](tower_lock::key::RouteKey::across_routes):
//!
//! ```
//! use axum::{Router, http::Method, routing::{get, post}};
//! use tower_lock::{LockEngine, LockLayer};
//! use tower_lock_axum::RouteKey;
//!
//! # fn main() -> Result<(), tower_lock::ConfigError> {
//! // Reports side by side, a reindex alone, per tenant.
//! let per_tenant = LockLayer::builder(LockEngine::in_memory())
//!     .key(RouteKey::param("id").across_routes())
//!     .shared_for([Method::GET])
//!     .build()?;
//! let app: Router = Router::new()
//!     .route("/tenants/{id}/report", get(|| async { "report" }))
//!     .route("/tenants/{id}/reindex", post(|| async { "reindexed" }))
//!     .route_layer(per_tenant);
//! # let _ = app;
//! # Ok(())
//! # }
//! ```

#![forbid(unsafe_code)]

#[cfg(feature = "postgres")]
mod transaction;
#[cfg(feature = "postgres")]
pub use transaction::{FenceRejection, Tx, TxRejection};

use std::{borrow::Cow, convert::Infallible, fmt};

use axum::{
    extract::{FromRequestParts, MatchedPath, OptionalFromRequestParts, OriginalUri},
    http::{StatusCode, request::Parts},
    response::{IntoResponse, Response},
};
use tower_lock::{
    Fence, LeaseInfo,
    key::{ExtractError, RequestView, RouteMatcher},
};

/// Extracts the [`LeaseInfo`] of the lock the request holds: its key, fencing token, wait
/// time and lost signal.
///
/// Rejects with [`LockNotInstalled`] (`500`) when the request holds no lock: the layer is
/// not installed on this route, or it let the request pass unlocked (no key under
/// [`MissingKeyPolicy::PassThrough`](tower_lock::MissingKeyPolicy::PassThrough), or the
/// fail-open policy). Extract `Option<Locked>` where that is expected. Under a dry run
/// (`dry_run(true)`) it never fails for a request the layer would have locked, rejected or
/// made wait: that request carries a lease info holding nothing
/// ([`LeaseInfo::is_dry_run`]), so the handler answers as under the enforcing layer.
#[derive(Clone, Debug)]
pub struct Locked(pub LeaseInfo);

impl<S: Send + Sync> FromRequestParts<S> for Locked {
    type Rejection = LockNotInstalled;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        parts
            .extensions
            .get::<LeaseInfo>()
            .cloned()
            .map(Locked)
            .ok_or(LockNotInstalled)
    }
}

impl<S: Send + Sync> OptionalFromRequestParts<S> for Locked {
    type Rejection = Infallible;

    async fn from_request_parts(
        parts: &mut Parts,
        _state: &S,
    ) -> Result<Option<Self>, Self::Rejection> {
        Ok(parts.extensions.get::<LeaseInfo>().cloned().map(Locked))
    }
}

/// Extracts just the fencing token of the lock the request holds; pass it to the
/// storage the lock protects. Rejects like [`Locked`].
#[derive(Clone, Copy, Debug)]
pub struct LockFence(pub Fence);

impl<S: Send + Sync> FromRequestParts<S> for LockFence {
    type Rejection = LockNotInstalled;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        parts
            .extensions
            .get::<LeaseInfo>()
            .map(|info| Self(info.fence()))
            .ok_or(LockNotInstalled)
    }
}

/// The request holds no lock: the tower-lock layer is not installed on this route, or let
/// the request pass unlocked. A server bug, answered `500 Internal Server Error`.
#[derive(Clone, Copy, Debug, Default)]
#[non_exhaustive]
pub struct LockNotInstalled;

impl LockNotInstalled {
    /// `500 Internal Server Error`.
    pub fn status(&self) -> StatusCode {
        StatusCode::INTERNAL_SERVER_ERROR
    }

    /// The body text.
    pub fn body_text(&self) -> &'static str {
        "the handler needs a lock, but the request holds none: is the tower-lock layer installed on this route (`route_layer`), and does it lock this method? `GET`, `HEAD`, `OPTIONS` and `TRACE` pass unlocked unless named in `methods([..])` or `shared_for([..])`"
    }
}

impl fmt::Display for LockNotInstalled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.body_text())
    }
}

impl std::error::Error for LockNotInstalled {}

impl IntoResponse for LockNotInstalled {
    fn into_response(self) -> Response {
        (self.status(), self.body_text()).into_response()
    }
}

/// A lock key from the matched route (axum's [`MatchedPath`]) and, optionally, its path
/// parameters. Install it with [`Router::route_layer`](axum::Router::route_layer) (see the
/// [crate docs](crate)); a parameter the matched route does not have is the server's
/// mistake, answered `500` and logged.
///
/// Its kind is `axum-route`, and its value the route and the chosen parameters; a layer
/// without a namespace then locks (see [`tower_lock::key`] for the lock key):
///
/// | extractor | `/tenants/{id}/jobs/{job}` called as `/tenants/7/jobs/9` locks |
/// |---|---|
/// | `RouteKey::route()` | `/axum-route//tenants/{id}/jobs/{job}`: one request at a time on the route |
/// | `RouteKey::params()` | `/axum-route//tenants/{id}/jobs/{job}\|id=7\|job=9`: per tenant and job |
/// | `RouteKey::param("id")` | `/axum-route//tenants/{id}/jobs/{job}\|id=7`: per tenant |
/// | `RouteKey::param("id").across_routes()` | `/axum-route/*\|id=7`: per tenant, on every route with `{id}` |
///
/// Parameter values are percent-decoded, as axum's `Path` decodes them, so `/tenants/acm%65`
/// and `/tenants/acme` lock the same key; a value that does not decode to UTF-8 is answered
/// `400`. In the value, `|` and `%` are escaped (in the route as in the parameters) so
/// that no parameter value can pose as another parameter or another route.
///
/// Two layers with one namespace and route keys share the locks of one route (and the
/// same parameters); to keep the locks of two layers on one route apart, give them
/// different namespaces.
pub type RouteKey = tower_lock::key::RouteKey<AxumRoutes>;

/// axum's router as a [`RouteMatcher`]: the route [`MatchedPath`] names, its parameters
/// read from the path ([`OriginalUri`]'s inside a nested router), decoded as axum's `Path`
/// decodes them. The adapter behind [`RouteKey`]; its kind is `axum-route`.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct AxumRoutes;

impl RouteMatcher for AxumRoutes {
    const KIND: &'static str = "axum-route";

    fn route<'r>(req: &'r dyn RequestView) -> Result<Cow<'r, str>, ExtractError> {
        match req.extensions().and_then(|e| e.get::<MatchedPath>()) {
            Some(matched) => Ok(Cow::Borrowed(matched.as_str())),
            // The server's setup: the layer sits outside any router. (A request that an axum
            // router routed to its fallback never gets here: the layer lets it through.)
            None => Err(ExtractError::misconfigured(
                "no matched route for the lock key: install the tower-lock layer with Router::route_layer",
            )),
        }
    }

    fn params<'a>(
        req: &'a dyn RequestView,
        route: &'a str,
    ) -> Result<Vec<(&'a str, &'a str)>, ExtractError> {
        // Inside a nested router the URI has lost its prefix; the matched path has not.
        let path = req
            .extensions()
            .and_then(|e| e.get::<OriginalUri>())
            .map_or_else(|| req.path(), |uri| uri.0.path());
        Ok(match_params(route, path))
    }

    fn decode<'a>(name: &str, raw: &'a str) -> Result<Cow<'a, str>, ExtractError> {
        decoded(name, raw)
    }
}

/// `(name, raw value)` of each parameter of `template` in `path`, matched by segment
/// position (the router already checked that the path has the template's shape).
fn match_params<'a>(template: &'a str, path: &'a str) -> Vec<(&'a str, &'a str)> {
    let mut out = Vec::new();
    let mut rest = path.strip_prefix('/').unwrap_or(path);
    for segment in template.strip_prefix('/').unwrap_or(template).split('/') {
        if let Some(name) = segment.strip_prefix("{*").and_then(|s| s.strip_suffix('}')) {
            out.push((name, rest));
            return out;
        }
        let (value, tail) = rest.split_once('/').unwrap_or((rest, ""));
        // `{{` is an escaped literal brace, not a parameter.
        if let Some(name) = segment.strip_prefix('{').and_then(|s| s.strip_suffix('}'))
            && !segment.starts_with("{{")
        {
            out.push((name, value));
        }
        rest = tail;
    }
    out
}

/// The decoded form of a raw path parameter.
fn decoded<'a>(name: &str, raw: &'a str) -> Result<Cow<'a, str>, ExtractError> {
    percent_encoding::percent_decode_str(raw)
        .decode_utf8()
        .map_err(|_| {
            ExtractError::malformed(format!(
                "path parameter {name} is not valid UTF-8 once decoded"
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_are_matched_by_position_and_wildcards_take_the_rest() {
        assert_eq!(
            match_params("/tenants/{id}/jobs/{job}", "/tenants/7/jobs/9"),
            vec![("id", "7"), ("job", "9")]
        );
        assert_eq!(
            match_params("/files/{*path}", "/files/a/b/c"),
            vec![("path", "a/b/c")]
        );
        assert!(match_params("/", "/").is_empty());
    }

    #[test]
    fn values_are_percent_decoded_like_axum_path() {
        assert_eq!(decoded("id", "acm%65").unwrap(), "acme");
        assert_eq!(decoded("id", "a%7Cb").unwrap(), "a|b");
        assert_eq!(decoded("id", "caf%C3%A9").unwrap(), "caf\u{e9}");
        assert!(decoded("id", "%FF").is_err());
    }

    #[test]
    fn route_keys_have_a_kind_of_their_own() {
        use tower_lock::key::KeyExtractor;

        assert_eq!(RouteKey::route().kind(), "axum-route");
        assert_eq!(RouteKey::params().kind(), "axum-route");
        assert_eq!(RouteKey::param("id").and("job").kind(), "axum-route");
    }
}

// The README's code blocks compile as doctests, so it cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
