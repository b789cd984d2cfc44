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

    /// [`header`](Self::header) by a name already parsed: a view of an `http` request
    /// then finds it without parsing the name again on every request (extractors keep
    /// theirs parsed). Default: [`header`](Self::header) of the name's text.
    fn header_named(&self, name: &http::HeaderName) -> Option<&[u8]> {
        self.header(name.as_str())
    }
    /// The request's `http` 1 extensions, when the request has them (used by
    /// route-aware extractors such as axum's matched path).
    fn extensions(&self) -> Option<&http::Extensions> {
        None
    }

    /// The query string, without the `?`, if the URI has one. Default: none.
    fn query(&self) -> Option<&str> {
        None
    }

    /// The value of the first header called `name` (lower case) as text: `None` when
    /// there is none, or when it is not UTF-8.
    ///
    /// ```
    /// use tower_lock::key::RequestView;
    ///
    /// let req = http::Request::get("/").header("x-user", "42").body(()).unwrap();
    /// assert_eq!(req.header_str("x-user"), Some("42"));
    /// ```
    fn header_str(&self, name: &str) -> Option<&str> {
        self.header(name)
            .and_then(|value| std::str::from_utf8(value).ok())
    }

    /// Every value of the headers called `name` (lower case), in the order the request
    /// has them. Default: the first value only (see [`header`](Self::header)); the `http`
    /// and actix views give them all.
    ///
    /// ```
    /// use tower_lock::key::RequestView;
    ///
    /// let req = http::Request::get("/")
    ///     .header("accept", "text/html")
    ///     .header("accept", "application/json")
    ///     .body(())
    ///     .unwrap();
    /// let all: Vec<&[u8]> = req.header_values("accept").collect();
    /// assert_eq!(all, [&b"text/html"[..], b"application/json"]);
    /// ```
    fn header_values<'a>(&'a self, name: &str) -> HeaderValues<'a> {
        HeaderValues::new(self.header(name).into_iter())
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

    /// The route the framework's router matched, as written in the application (axum's
    /// `MatchedPath`, actix-web's match pattern, e.g. `/orders/{id}`), never a value the
    /// client sent: the layer adds it to the holder label it stores with each lease, so
    /// that `tower-lock-cli status` shows which route holds a key. `None` when no router
    /// matched or the framework does not tell. The default reads axum's `MatchedPath`
    /// from the extensions (with the `axum` feature).
    fn route_template(&self) -> Option<std::borrow::Cow<'_, str>> {
        #[cfg(feature = "axum")]
        {
            self.extensions()
                .and_then(|e| e.get::<axum::extract::MatchedPath>())
                .map(|m| std::borrow::Cow::Borrowed(m.as_str()))
        }
        #[cfg(not(feature = "axum"))]
        {
            None
        }
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

    fn header_named(&self, name: &http::HeaderName) -> Option<&[u8]> {
        self.headers().get(name).map(|v| v.as_bytes())
    }

    fn header_values<'a>(&'a self, name: &str) -> HeaderValues<'a> {
        self.headers().get_all(name).into()
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

    fn header_named(&self, name: &http::HeaderName) -> Option<&[u8]> {
        self.headers.get(name).map(|v| v.as_bytes())
    }

    fn header_values<'a>(&'a self, name: &str) -> HeaderValues<'a> {
        self.headers.get_all(name).into()
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

/// The values of one header of a [`RequestView`], in request order (see
/// [`RequestView::header_values`]). From an `http` header map it costs no allocation;
/// another framework's view makes one from any iterator with [`HeaderValues::new`].
pub struct HeaderValues<'a>(Values<'a>);

enum Values<'a> {
    Http(http::header::ValueIter<'a, http::HeaderValue>),
    Other(Box<dyn Iterator<Item = &'a [u8]> + 'a>),
}

impl<'a> HeaderValues<'a> {
    /// The values `values` yields.
    pub fn new(values: impl Iterator<Item = &'a [u8]> + 'a) -> Self {
        HeaderValues(Values::Other(Box::new(values)))
    }
}

impl<'a> From<http::header::GetAll<'a, http::HeaderValue>> for HeaderValues<'a> {
    fn from(values: http::header::GetAll<'a, http::HeaderValue>) -> Self {
        HeaderValues(Values::Http(values.iter()))
    }
}

impl<'a> Iterator for HeaderValues<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        match &mut self.0 {
            Values::Http(values) => values.next().map(http::HeaderValue::as_bytes),
            Values::Other(values) => values.next(),
        }
    }
}

impl std::fmt::Debug for HeaderValues<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeaderValues").finish_non_exhaustive()
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
