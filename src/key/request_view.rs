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

    /// Every value of the headers called `name` (lower case), in the order the request
    /// has them, each passed to `each`. Default: the first value only (see
    /// [`header`](Self::header)); the `http` and actix views pass them all.
    fn header_values(&self, name: &str, each: &mut dyn FnMut(&[u8])) {
        if let Some(value) = self.header(name) {
            each(value);
        }
    }

    /// The authority the request was addressed to: the URI's authority (HTTP/2, absolute
    /// form), else the `Host` header. Default: the `Host` header.
    fn authority(&self) -> Option<&[u8]> {
        self.header("host")
    }

    /// The path and query the client sent, before a router stripped a prefix from them
    /// (axum's `Router::nest`: then [`path`](Self::path) is what the nested router sees).
    /// Default: [`path`](Self::path) and [`query`](Self::query). For `http` requests
    /// served by axum, this is axum's `OriginalUri` when the crate feature `axum` is on
    /// (`tower-lock-axum` turns it on).
    fn original_target(&self) -> (&str, Option<&str>) {
        (self.path(), self.query())
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

    fn header_values(&self, name: &str, each: &mut dyn FnMut(&[u8])) {
        header_values(self.headers(), name, each);
    }

    fn authority(&self) -> Option<&[u8]> {
        authority(self.uri(), self.headers())
    }

    fn original_target(&self) -> (&str, Option<&str>) {
        original_target(self.uri(), self.extensions())
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

    fn header_values(&self, name: &str, each: &mut dyn FnMut(&[u8])) {
        header_values(&self.headers, name, each);
    }

    fn authority(&self) -> Option<&[u8]> {
        authority(&self.uri, &self.headers)
    }

    fn original_target(&self) -> (&str, Option<&str>) {
        original_target(&self.uri, &self.extensions)
    }

    fn extensions(&self) -> Option<&http::Extensions> {
        Some(&self.extensions)
    }

    fn query(&self) -> Option<&str> {
        self.uri.query()
    }
}

fn header_values(headers: &http::HeaderMap, name: &str, each: &mut dyn FnMut(&[u8])) {
    for value in headers.get_all(name) {
        each(value.as_bytes());
    }
}

/// The URI's authority (HTTP/2, absolute form), else the `Host` header.
fn authority<'a>(uri: &'a http::Uri, headers: &'a http::HeaderMap) -> Option<&'a [u8]> {
    match uri.authority() {
        Some(authority) => Some(authority.as_str().as_bytes()),
        None => headers.get(http::header::HOST).map(|v| v.as_bytes()),
    }
}

fn original_target<'a>(
    uri: &'a http::Uri,
    extensions: &'a http::Extensions,
) -> (&'a str, Option<&'a str>) {
    let uri = original_uri(extensions).unwrap_or(uri);
    (uri.path(), uri.query())
}

/// The URI before any router stripped a prefix: axum's `OriginalUri`, which its outermost
/// router puts in the extensions.
#[cfg(feature = "axum")]
fn original_uri(extensions: &http::Extensions) -> Option<&http::Uri> {
    extensions
        .get::<axum::extract::OriginalUri>()
        .map(|original| &original.0)
}

#[cfg(not(feature = "axum"))]
fn original_uri(_: &http::Extensions) -> Option<&http::Uri> {
    None
}
