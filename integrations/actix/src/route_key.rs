//! [`RouteKey`]: the lock key from the route actix-web matched and its path parameters.

use std::borrow::Cow;

use actix_web::HttpRequest;
use tower_lock::key::{ExtractError, RequestView, RouteMatcher};

use crate::http_request;

/// A lock key from the route actix-web matched ([`HttpRequest::match_pattern`]) and,
/// optionally, its path parameters ([`HttpRequest::match_info`]): the actix counterpart of
/// `tower_lock_axum::RouteKey`. Needs the middleware on a
/// [`web::resource`](actix_web::web::resource) (or a
/// [`web::scope`](actix_web::web::scope) with the parameters in its path), where routing has
/// happened. Wrapped around the whole `App`, before routing, it answers `400` where it
/// would need parameters not matched yet, and for paths that match no route.
///
/// Its kind is `actix-route`; its value the route pattern and the chosen parameters:
///
/// | extractor | `/tenants/{id}/jobs/{job}` called as `/tenants/7/jobs/9` locks |
/// |---|---|
/// | `RouteKey::route()` | `/actix-route//tenants/{id}/jobs/{job}`: one request at a time on the route |
/// | `RouteKey::params()` | `/actix-route//tenants/{id}/jobs/{job}\|id=7\|job=9`: per tenant and job |
/// | `RouteKey::param("id")` | `/actix-route//tenants/{id}/jobs/{job}\|id=7`: per tenant |
/// | `RouteKey::param("id").across_routes()` | `/actix-route/*\|id=7`: per tenant, on every route with `{id}` |
///
/// Parameter values are percent-decoded as actix's `web::Path` decodes them (bytes that
/// are not UTF-8 become U+FFFD, as they do for the handler), so `/tenants/acm%65` and
/// `/tenants/acme` lock the same key. `|` and `%` are escaped in the value, so that no
/// parameter value can pose as another parameter or another route.
///
/// ```
/// use actix_web::{App, web};
/// use tower_lock::{LockEngine, LockLayer};
/// use tower_lock_actix::{LockMiddleware, RouteKey};
///
/// # fn main() -> Result<(), tower_lock::ConfigError> {
/// let per_tenant: LockMiddleware = LockLayer::builder(LockEngine::in_memory())
///     .key(RouteKey::param("id"))
///     .build()?
///     .try_into()?;
/// let app = App::new().service(
///     web::resource("/tenants/{id}/jobs")
///         .wrap(per_tenant)
///         .route(web::post().to(|| async { "queued" })),
/// );
/// # let _ = app;
/// # Ok(())
/// # }
/// ```
///
/// [`HttpRequest::match_pattern`]: actix_web::HttpRequest::match_pattern
/// [`HttpRequest::match_info`]: actix_web::HttpRequest::match_info
pub type RouteKey = tower_lock::key::RouteKey<ActixRoutes>;

/// actix-web's router as a [`RouteMatcher`]: the route [`HttpRequest::match_pattern`]
/// names and its parameters ([`HttpRequest::match_info`]), decoded as `web::Path` decodes
/// them. The adapter behind [`RouteKey`]; its kind is `actix-route`.
///
/// [`HttpRequest::match_pattern`]: actix_web::HttpRequest::match_pattern
/// [`HttpRequest::match_info`]: actix_web::HttpRequest::match_info
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct ActixRoutes;

impl RouteMatcher for ActixRoutes {
    const KIND: &'static str = "actix-route";

    fn route<'r>(req: &'r dyn RequestView) -> Result<Cow<'r, str>, ExtractError> {
        match actix_request(req)?.match_pattern() {
            Some(pattern) => Ok(Cow::Owned(pattern)),
            None => Err(ExtractError::misconfigured(
                "no matched route for the lock key: wrap a web::resource or web::scope with the middleware, not the App",
            )),
        }
    }

    fn params<'a>(
        req: &'a dyn RequestView,
        route: &'a str,
    ) -> Result<Vec<(&'a str, &'a str)>, ExtractError> {
        let info = actix_request(req)?.match_info();
        // Around the whole `App` the middleware runs before routing: actix still finds the
        // pattern by the path, but has matched no parameter yet. Keying on the pattern
        // alone would put every tenant under one lock.
        if info.segment_count() == 0 && route.contains('{') {
            return Err(ExtractError::misconfigured(format!(
                "the parameters of {route} are not matched yet: wrap the web::resource or web::scope with the middleware, not the App"
            )));
        }
        Ok(info.iter().collect())
    }

    /// Fully percent-decoded (actix's router leaves `%2F`, `%25` and `%2B` encoded and
    /// decodes the rest lossily; `web::Path` decodes these three the same way).
    fn decode<'a>(_name: &str, raw: &'a str) -> Result<Cow<'a, str>, ExtractError> {
        Ok(percent_encoding::percent_decode_str(raw).decode_utf8_lossy())
    }
}

/// The actix-web request behind `req`, or the server's mistake: a route key of actix
/// used outside [`LockMiddleware`](crate::LockMiddleware).
fn actix_request(req: &dyn RequestView) -> Result<&HttpRequest, ExtractError> {
    http_request(req).ok_or_else(|| {
        ExtractError::misconfigured(
            "tower_lock_actix::RouteKey needs an actix-web request (tower_lock_actix::LockMiddleware)",
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower_lock::key::KeyExtractor;

    #[test]
    fn values_are_fully_decoded() {
        assert_eq!(ActixRoutes::decode("id", "a%2Fb%7Cc").unwrap(), "a/b|c");
        assert_eq!(ActixRoutes::decode("id", "%FF").unwrap(), "\u{fffd}");
    }

    #[test]
    fn route_keys_have_a_kind_of_their_own() {
        assert_eq!(RouteKey::route().kind(), "actix-route");
        assert_eq!(RouteKey::param("id").and("job").kind(), "actix-route");
    }
}
