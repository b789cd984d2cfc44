//! [`RequestView`]: the parts of a request that key extractors may look at.

/// The parts of a request that key extractors may look at.
///
/// Implemented for [`http::Request`] and [`http::request::Parts`]. A framework built on
/// other request types implements it for a thin wrapper around its own request.
pub trait RequestView {
    /// The request method, e.g. `"POST"`.
    fn method(&self) -> &str;
    /// The request path, without the query string.
    fn path(&self) -> &str;
    /// The value of the first header called `name` (lower case), as raw bytes.
    fn header(&self, name: &str) -> Option<&[u8]>;
    /// The request's `http` 1 extensions, when the request has them (used by
    /// route-aware extractors such as axum's matched path).
    fn extensions(&self) -> Option<&http::Extensions> {
        None
    }

    /// The query string, without the `?`, if the URI has one. Default: none.
    fn query(&self) -> Option<&str> {
        None
    }

    /// The framework's own request, for extractors written for one framework: an
    /// integration whose requests are not `http` 1 requests offers its request type here
    /// (`tower-lock-actix` offers actix-web's `HttpRequest`, which its `RouteKey` reads the
    /// matched route from), and such an extractor downcasts it. `None` by default.
    fn framework_request(&self) -> Option<&dyn std::any::Any> {
        None
    }
}

impl<B> RequestView for http::Request<B> {
    fn method(&self) -> &str {
        self.method().as_str()
    }

    fn path(&self) -> &str {
        self.uri().path()
    }

    fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers().get(name).map(|v| v.as_bytes())
    }

    fn extensions(&self) -> Option<&http::Extensions> {
        Some(self.extensions())
    }

    fn query(&self) -> Option<&str> {
        self.uri().query()
    }
}

impl RequestView for http::request::Parts {
    fn method(&self) -> &str {
        self.method.as_str()
    }

    fn path(&self) -> &str {
        self.uri.path()
    }

    fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers.get(name).map(|v| v.as_bytes())
    }

    fn extensions(&self) -> Option<&http::Extensions> {
        Some(&self.extensions)
    }

    fn query(&self) -> Option<&str> {
        self.uri.query()
    }
}
