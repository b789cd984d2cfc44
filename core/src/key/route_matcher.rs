//! [`RouteMatcher`]: what a framework tells a [`RouteKey`](super::RouteKey), the route it
//! matched and its path parameters; and [`MatchedRoute`], its answer.

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

    /// The route `req` matched, with its path parameters (raw, as in the path) when
    /// `params` is true. A request with no matched route is the server's setup (the layer
    /// sits outside the router): [`ExtractError::misconfigured`], naming the fix.
    fn matched<'r>(
        req: &'r dyn RequestView,
        params: bool,
    ) -> Result<MatchedRoute<'r>, ExtractError>;

    /// The raw parameter `name`'s value, percent-decoded as the framework's own path
    /// extractor decodes it (so `/tenants/acm%65` and `/tenants/acme` lock one key), or
    /// [`ExtractError::malformed`] when the framework would refuse it too.
    fn decode<'a>(name: &str, raw: &'a str) -> Result<Cow<'a, str>, ExtractError>;
}

/// The route a [`RouteMatcher`] matched: its pattern and its raw path parameters.
#[derive(Clone, Debug)]
pub struct MatchedRoute<'r> {
    /// The pattern the router matched, e.g. `/tenants/{id}/jobs`.
    pub route: Cow<'r, str>,
    /// `(name, raw value)` of each path parameter, in route order (empty when not asked).
    pub params: Vec<(&'r str, &'r str)>,
}
