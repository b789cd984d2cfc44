//! [`RouteKey`]: a lock key from the route a framework matched and the path parameters
//! chosen, written once for every framework (each brings a [`RouteMatcher`]).

use std::{fmt, marker::PhantomData};

use super::{ExtractError, KeyExtractor, RequestView, RouteMatcher, route::RouteValue};

/// A lock key from the route the framework `R` matched and, optionally, its path
/// parameters: `tower_lock_axum::RouteKey` and `tower_lock_actix::RouteKey` are this type
/// over their framework's [`RouteMatcher`]. Its kind is `R::KIND`.
///
/// The value is the route pattern, then `|name=value` for each chosen parameter (its
/// value percent-decoded as the framework decodes it); `%` and `|` are escaped (as `%25`
/// and `%7C`) in the pattern and in each value, so that no parameter value can pose as
/// another parameter or another route. A parameter the matched route does not have is
/// the server's mistake (`500`, logged); a name that can name no parameter (empty, or
/// holding `/`, `{`, `}` or `*`) is refused by `build()`.
///
/// [`across_routes`](Self::across_routes) leaves the route out: `RouteKey::param("id")
/// .across_routes()` gives `GET /tenants/{id}/report` and `POST /tenants/{id}/reindex`
/// one key per tenant (the value `*|id=7`), with no path parser of your own.
pub struct RouteKey<R> {
    params: Params,
    /// Whether the route pattern is left out of the value (`across_routes`).
    any_route: bool,
    _router: PhantomData<fn() -> R>,
}

/// Which parameters a route key locks on.
#[derive(Clone, Debug)]
enum Params {
    None,
    All,
    Named(Vec<String>),
}

impl<R> RouteKey<R> {
    fn with(params: Params) -> Self {
        Self {
            params,
            any_route: false,
            _router: PhantomData,
        }
    }

    /// The matched route alone.
    pub fn route() -> Self {
        Self::with(Params::None)
    }

    /// The matched route and all of its path parameters.
    pub fn params() -> Self {
        Self::with(Params::All)
    }

    /// The matched route and the parameter `name`; chain [`and`](Self::and) for more.
    pub fn param(name: impl Into<String>) -> Self {
        Self::with(Params::Named(vec![name.into()]))
    }

    /// Also key on the parameter `name`.
    #[must_use]
    pub fn and(mut self, name: impl Into<String>) -> Self {
        match &mut self.params {
            Params::Named(names) => names.push(name.into()),
            _ => self.params = Params::Named(vec![name.into()]),
        }
        self
    }

    /// Key on the chosen parameters alone, whichever route matched: every route with
    /// them shares the key, so a layer over `GET /tenants/{id}/report` and
    /// `POST /tenants/{id}/reindex` (with `shared_for(["GET"])`: reports side by side, a
    /// reindex alone) excludes per tenant across both. The value is `*` (no route
    /// pattern is `*`) followed by the parameters, as for one route. Routes without one
    /// of the parameters are the server's mistake (`500`, logged), as for one route:
    /// install the layer on the routes that have them (`tower_lock_axum::RouteKey` shows
    /// an example).
    #[must_use]
    pub fn across_routes(mut self) -> Self {
        self.any_route = true;
        self
    }
}

impl<R> Clone for RouteKey<R> {
    fn clone(&self) -> Self {
        Self {
            any_route: self.any_route,
            ..Self::with(self.params.clone())
        }
    }
}

impl<R> fmt::Debug for RouteKey<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RouteKey")
            .field("params", &self.params)
            .field("across_routes", &self.any_route)
            .finish()
    }
}

impl<R: RouteMatcher> KeyExtractor for RouteKey<R> {
    fn extract(&self, req: &dyn RequestView) -> Result<Option<String>, ExtractError> {
        let route = R::route(req)?;
        // `*` is no route's pattern (a pattern starts with `/`, or is empty), so a key
        // across routes never meets the key of one route.
        let mut key = RouteValue::new(if self.any_route { "*" } else { &route });
        match &self.params {
            Params::None => {}
            Params::All => {
                for (name, raw) in R::params(req, &route)? {
                    key.param(name, &R::decode(name, raw)?);
                }
            }
            Params::Named(names) => {
                let params = R::params(req, &route)?;
                for name in names {
                    let Some((_, raw)) = params.iter().find(|(n, _)| n == name) else {
                        return Err(ExtractError::misconfigured(format!(
                            "the route {route} has no parameter {name}"
                        )));
                    };
                    key.param(name, &R::decode(name, raw)?);
                }
            }
        }
        Ok(Some(key.into_string()))
    }

    fn kind(&self) -> &str {
        R::KIND
    }

    fn validate(&self) -> Result<(), String> {
        match &self.params {
            Params::Named(names) => names.iter().try_for_each(|n| check_param_name(n)),
            Params::None | Params::All => Ok(()),
        }
    }
}

/// Whether `name` can name a path parameter of any route: a name that is empty or holds
/// `/`, `{`, `}` or `*` never matches, so a layer keyed on it is refused by `build()`
/// rather than answering every request with a `500`.
fn check_param_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.contains(['/', '{', '}', '*']) {
        return Err(format!(
            "{name:?} can never name a path parameter (give the name without braces, e.g. \"id\" for /tenants/{{id}})"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use super::*;

    /// A router that matched `/t/{id}/j/{job}` with the path parameters in the `x-params`
    /// header (`id=7,job=9`), decoding `%7C` only.
    struct Fake;

    impl RouteMatcher for Fake {
        const KIND: &'static str = "fake-route";

        fn route<'r>(_: &'r dyn RequestView) -> Result<Cow<'r, str>, ExtractError> {
            Ok(Cow::Borrowed("/t/{id}/j/{job}"))
        }

        fn params<'a>(
            req: &'a dyn RequestView,
            _: &'a str,
        ) -> Result<Vec<(&'a str, &'a str)>, ExtractError> {
            let raw = req.header_str("x-params").unwrap_or("");
            Ok(raw.split(',').filter_map(|p| p.split_once('=')).collect())
        }

        fn decode<'a>(_: &str, raw: &'a str) -> Result<Cow<'a, str>, ExtractError> {
            Ok(Cow::Owned(raw.replace("%7C", "|")))
        }
    }

    fn value(key: &RouteKey<Fake>, params: &str) -> Result<Option<String>, ExtractError> {
        key.extract(&crate::key::test_request(&[("x-params", params)]))
    }

    #[test]
    fn the_selection_picks_the_route_and_its_parameters() {
        let all = "id=7,job=a%7Cjob=9";
        assert_eq!(
            value(&RouteKey::route(), all).unwrap().unwrap(),
            "/t/{id}/j/{job}"
        );
        assert_eq!(
            value(&RouteKey::params(), all).unwrap().unwrap(),
            "/t/{id}/j/{job}|id=7|job=a%7Cjob=9"
        );
        assert_eq!(
            value(&RouteKey::param("job").and("id"), all)
                .unwrap()
                .unwrap(),
            "/t/{id}/j/{job}|job=a%7Cjob=9|id=7"
        );
        let missing = value(&RouteKey::param("nope"), all).unwrap_err();
        assert_eq!(missing.kind(), crate::key::ExtractErrorKind::Misconfigured);
        assert_eq!(RouteKey::<Fake>::route().kind(), "fake-route");
        assert_eq!(
            value(&RouteKey::param("id").across_routes(), all)
                .unwrap()
                .unwrap(),
            "*|id=7"
        );
    }

    #[test]
    fn names_that_can_name_no_parameter_are_refused() {
        assert!(RouteKey::<Fake>::param("id").validate().is_ok());
        for bad in ["", "{id}", "a/b", "*rest"] {
            assert!(
                RouteKey::<Fake>::param("id").and(bad).validate().is_err(),
                "{bad:?}"
            );
        }
        assert!(RouteKey::<Fake>::params().validate().is_ok());
    }
}
