//! [`RouteMatcher`]: what a framework tells a [`RouteKey`](super::RouteKey): the route it
//! matched, its path parameters, and how it decodes them.

use std::borrow::Cow;

use super::{ExtractError, RequestView};

/// A framework's router, seen by a [`RouteKey`](super::RouteKey): the one thing a framework
/// integration writes for its route keys (`tower_lock_axum::RouteKey` is
/// `RouteKey<AxumRoutes>`). The selection of parameters, their escaping, the kind and the
/// build-time checks are the core's.
pub trait RouteMatcher: Send + Sync + 'static {
    /// The kind of the framework's route keys (`axum-route`, `actix-route`): routes of two
    /// frameworks never share a lock.
    const KIND: &'static str;

    /// The pattern of the route `req` matched, e.g. `/tenants/{id}/jobs`. A request with
    /// no matched route is the server's setup (the layer sits outside the router):
    /// [`ExtractError::misconfigured`], naming the fix.
    fn route<'r>(req: &'r dyn RequestView) -> Result<Cow<'r, str>, ExtractError>;

    /// `(name, raw value)` of each path parameter of `route` in `req`, in route order;
    /// asked only by a key that locks on parameters.
    fn params<'a>(
        req: &'a dyn RequestView,
        route: &'a str,
    ) -> Result<Vec<(&'a str, &'a str)>, ExtractError>;

    /// The raw parameter `name`'s value, percent-decoded as the framework's own path
    /// extractor decodes it (so `/tenants/acm%65` and `/tenants/acme` lock one key), or
    /// [`ExtractError::malformed`] when the framework would refuse it too.
    fn decode<'a>(name: &str, raw: &'a str) -> Result<Cow<'a, str>, ExtractError>;
}
