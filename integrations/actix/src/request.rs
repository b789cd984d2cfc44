//! [`ActixRequest`]: an actix-web request seen as tower-lock's [`RequestView`], so that the
//! key extractors and the request locker work on it; and [`http_request`], the way back.

use std::any::Any;

use actix_web::{HttpRequest, dev::ServiceRequest, http::header::HeaderValue};
use tower_lock::key::{HeaderValues, RequestView};

/// An actix request seen as a [`RequestView`], so that tower-lock's key extractors and
/// [`RequestLocker`](tower_lock_core::RequestLocker) work on actix requests.
///
/// Extractors written for actix reach the whole [`HttpRequest`] through it (see
/// [`http_request`]): its extensions, the matched route and its parameters (as
/// [`RouteKey`](crate::RouteKey) does). Extractors that need `http` 1 extensions (axum's route keys,
/// [`Principal`](tower_lock::key::Principal)) find none here.
///
/// ```
/// use actix_web::test::TestRequest;
/// use tower_lock::key::{IdempotencyKey, KeyExtractor};
/// use tower_lock_actix::ActixRequest;
///
/// let req = TestRequest::post().insert_header(("idempotency-key", "\"k-1\"")).to_srv_request();
/// let key = IdempotencyKey::new().extract(&ActixRequest::from(&req)).unwrap();
/// assert_eq!(key.as_deref(), Some("k-1"));
/// ```
#[derive(Clone, Copy, Debug)]
pub struct ActixRequest<'a> {
    req: &'a HttpRequest,
}

impl<'a> ActixRequest<'a> {
    /// A view of `req`.
    pub fn new(req: &'a HttpRequest) -> Self {
        ActixRequest { req }
    }
}

impl<'a> From<&'a ServiceRequest> for ActixRequest<'a> {
    fn from(req: &'a ServiceRequest) -> Self {
        ActixRequest::new(req.request())
    }
}

impl<'a> From<&'a HttpRequest> for ActixRequest<'a> {
    fn from(req: &'a HttpRequest) -> Self {
        ActixRequest::new(req)
    }
}

impl RequestView for ActixRequest<'_> {
    fn method(&self) -> &str {
        self.req.head().method.as_str()
    }

    fn path(&self) -> &str {
        self.req.head().uri.path()
    }

    fn header(&self, name: &str) -> Option<&[u8]> {
        self.req.headers().get(name).map(HeaderValue::as_bytes)
    }

    fn header_values<'a>(&'a self, name: &str) -> HeaderValues<'a> {
        HeaderValues::new(self.req.headers().get_all(name).map(HeaderValue::as_bytes))
    }

    fn authority(&self) -> Option<&[u8]> {
        match self.req.head().uri.authority() {
            Some(authority) => Some(authority.as_str().as_bytes()),
            None => self.header("host"),
        }
    }

    fn query(&self) -> Option<&str> {
        self.req.head().uri.query()
    }

    fn framework_request(&self) -> Option<&dyn Any> {
        Some(self.req)
    }

    /// The resource pattern actix-web matched (`/orders/{id}`), for the holder label.
    fn route_template(&self) -> Option<std::borrow::Cow<'_, str>> {
        self.req.match_pattern().map(std::borrow::Cow::Owned)
    }
}

/// The actix-web request behind `req`, when `req` is an [`ActixRequest`] (the view
/// [`LockMiddleware`](crate::LockMiddleware) shows extractors): for extractors written for actix, to read the
/// request's extensions, its matched route, its app data.
///
/// ```
/// use actix_web::{HttpMessage, test::TestRequest};
/// use tower_lock::key::{self, ExtractError, KeyExtractor};
/// use tower_lock_actix::{ActixRequest, http_request};
///
/// /// Put in the extensions by an authentication middleware.
/// #[derive(Clone)]
/// struct UserId(u64);
///
/// // One request at a time per signed-in user.
/// let per_user = key::from_fn("user", |req| {
///     let Some(req) = http_request(req) else {
///         return Err(ExtractError::misconfigured("not an actix request"));
///     };
///     Ok(req.extensions().get::<UserId>().map(|user| user.0.to_string()))
/// });
///
/// let req = TestRequest::post().to_srv_request();
/// req.extensions_mut().insert(UserId(7));
/// assert_eq!(per_user.extract(&ActixRequest::from(&req)).unwrap().as_deref(), Some("7"));
/// ```
pub fn http_request(req: &dyn RequestView) -> Option<&HttpRequest> {
    req.framework_request()?.downcast_ref::<HttpRequest>()
}
