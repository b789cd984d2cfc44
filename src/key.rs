//! Deriving a lock key from a request: the [`KeyExtractor`] trait and the built-in
//! extractors.
//!
//! Extractors see a request through [`RequestView`]: method, path, headers, and (for
//! `http` 1 requests) the extensions. That keeps them framework-neutral: the tower layer
//! hands them an [`http::Request`], and an integration for a framework with other request
//! types implements [`RequestView`] for its own request.
//!
//! ```
//! use http::HeaderName;
//! use tower_lock::key::{HeaderKey, IdempotencyKey, KeyExtractor, RequestView, ScopedKey};
//!
//! // One lock per tenant.
//! let per_tenant = HeaderKey::new(HeaderName::from_static("x-tenant-id"));
//! // One lock per idempotency key, within a tenant.
//! let idempotent = ScopedKey::new(HeaderName::from_static("x-tenant-id"), IdempotencyKey::new());
//! // Anything else: a closure.
//! let per_account = |req: &dyn RequestView| {
//!     req.path().strip_prefix("/accounts/").map(|rest| rest.split('/').next().unwrap_or("").to_owned())
//! };
//!
//! let req = http::Request::builder()
//!     .uri("/accounts/7/transfers")
//!     .header("x-tenant-id", "acme")
//!     .header("idempotency-key", "\"8e03978e\"")
//!     .body(())
//!     .unwrap();
//! assert_eq!(per_tenant.extract(&req).unwrap().as_deref(), Some("acme"));
//! assert_eq!(idempotent.extract(&req).unwrap().as_deref(), Some("tenant:4:acme|idempotency-key:8e03978e"));
//! assert_eq!(per_account.extract(&req).unwrap().as_deref(), Some("7"));
//! ```

use std::{borrow::Cow, error::Error as StdError, fmt};

use http::HeaderName;

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
}

/// A key that is present but unusable; the request is answered `400 Bad Request` with
/// the reason as the problem's `detail`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MalformedKey {
    reason: Cow<'static, str>,
}

impl MalformedKey {
    /// A malformed key, with a reason a client can act on.
    pub fn new(reason: impl Into<Cow<'static, str>>) -> Self {
        MalformedKey {
            reason: reason.into(),
        }
    }

    /// Why the key was refused.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

impl fmt::Display for MalformedKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason)
    }
}

impl StdError for MalformedKey {}

/// Derives the lock key of a request.
///
/// `Ok(Some(key))` locks `key`; `Ok(None)` means the request has no key (the layer's
/// missing-key policy decides: pass through unlocked, or `400`); `Err` means a key was
/// given but is malformed (`400`). The key is then validated as a
/// [`LockKey`](crate::LockKey) (at most 512 bytes with the layer's prefix, no control
/// characters); a key that fails is also answered `400`.
///
/// Closures `Fn(&dyn RequestView) -> Option<String>` are extractors.
pub trait KeyExtractor: Send + Sync + 'static {
    /// The key of `req`.
    fn extract(&self, req: &dyn RequestView) -> Result<Option<String>, MalformedKey>;
}

impl<F> KeyExtractor for F
where
    F: Fn(&dyn RequestView) -> Option<String> + Send + Sync + 'static,
{
    fn extract(&self, req: &dyn RequestView) -> Result<Option<String>, MalformedKey> {
        Ok(self(req))
    }
}

fn header_str<'a>(
    req: &'a dyn RequestView,
    name: &HeaderName,
) -> Result<Option<&'a str>, MalformedKey> {
    match req.header(name.as_str()) {
        None => Ok(None),
        Some(raw) => std::str::from_utf8(raw)
            .map(|s| Some(s.trim()))
            .map_err(|_| MalformedKey::new(format!("the {name} header is not valid UTF-8"))),
    }
}

/// The value of a named header is the key. An absent or empty header means no key.
#[derive(Debug, Clone)]
pub struct HeaderKey {
    name: HeaderName,
}

impl HeaderKey {
    /// Lock on the value of header `name`.
    pub fn new(name: HeaderName) -> Self {
        HeaderKey { name }
    }
}

impl KeyExtractor for HeaderKey {
    fn extract(&self, req: &dyn RequestView) -> Result<Option<String>, MalformedKey> {
        Ok(header_str(req, &self.name)?
            .filter(|v| !v.is_empty())
            .map(str::to_owned))
    }
}

/// The longest idempotency key accepted, in characters.
pub const MAX_IDEMPOTENCY_KEY_LEN: usize = 255;

/// The `Idempotency-Key` header, as the IETF `draft-ietf-httpapi-idempotency-key-header`
/// defines it: a structured-field string (`"8e03978e"`), with the bare form (`8e03978e`)
/// also accepted. At most [`MAX_IDEMPOTENCY_KEY_LEN`] characters of printable ASCII;
/// anything else is malformed (`400`).
///
/// The key is `idempotency-key:<value>`.
#[derive(Debug, Clone, Default)]
pub struct IdempotencyKey {
    _priv: (),
}

impl IdempotencyKey {
    /// The `Idempotency-Key` header.
    pub fn new() -> Self {
        IdempotencyKey { _priv: () }
    }

    /// Parse one header value.
    pub fn parse(raw: &[u8]) -> Result<String, MalformedKey> {
        let raw = raw.trim_ascii();
        let value = match raw {
            [b'"', inner @ .., b'"'] => unquote(inner)?,
            [b'"', ..] => {
                return Err(MalformedKey::new(
                    "the Idempotency-Key header has an unterminated quoted string",
                ));
            }
            bare => {
                if bare.contains(&b'"') || bare.contains(&b'\\') {
                    return Err(MalformedKey::new(
                        "the Idempotency-Key header has a quote or backslash outside a quoted string",
                    ));
                }
                bare.to_vec()
            }
        };
        if value.is_empty() {
            return Err(MalformedKey::new("the Idempotency-Key header is empty"));
        }
        if value.len() > MAX_IDEMPOTENCY_KEY_LEN {
            return Err(MalformedKey::new(format!(
                "the Idempotency-Key is {} characters long, more than {MAX_IDEMPOTENCY_KEY_LEN}",
                value.len()
            )));
        }
        if !value.iter().all(|b| (0x20..=0x7e).contains(b)) {
            return Err(MalformedKey::new(
                "the Idempotency-Key must be printable ASCII",
            ));
        }
        // Printable ASCII is valid UTF-8.
        Ok(String::from_utf8(value).expect("printable ASCII"))
    }
}

/// Unescape the inside of a structured-field string: `\"` and `\\` only.
fn unquote(inner: &[u8]) -> Result<Vec<u8>, MalformedKey> {
    let mut out = Vec::with_capacity(inner.len());
    let mut bytes = inner.iter();
    while let Some(&b) = bytes.next() {
        match b {
            b'\\' => match bytes.next() {
                Some(&e @ (b'"' | b'\\')) => out.push(e),
                _ => {
                    return Err(MalformedKey::new(
                        "the Idempotency-Key header has an invalid escape",
                    ));
                }
            },
            b'"' => {
                return Err(MalformedKey::new(
                    "the Idempotency-Key header has an unescaped quote",
                ));
            }
            b => out.push(b),
        }
    }
    Ok(out)
}

impl KeyExtractor for IdempotencyKey {
    fn extract(&self, req: &dyn RequestView) -> Result<Option<String>, MalformedKey> {
        match req.header("idempotency-key") {
            None => Ok(None),
            Some(raw) => Self::parse(raw).map(|v| Some(format!("idempotency-key:{v}"))),
        }
    }
}

/// Another extractor's key, scoped by a tenant or principal header: two tenants sending
/// the same inner key lock different keys. A request without the scope header has no key.
///
/// The key is `tenant:<len>:<scope>|<inner>`; the length prefix keeps a scope containing
/// `|` from colliding with another scope's keys.
#[derive(Debug, Clone)]
pub struct ScopedKey<K> {
    scope: HeaderName,
    inner: K,
}

impl<K: KeyExtractor> ScopedKey<K> {
    /// Scope `inner` by the value of header `scope`.
    pub fn new(scope: HeaderName, inner: K) -> Self {
        ScopedKey { scope, inner }
    }
}

impl<K: KeyExtractor> KeyExtractor for ScopedKey<K> {
    fn extract(&self, req: &dyn RequestView) -> Result<Option<String>, MalformedKey> {
        let Some(scope) = header_str(req, &self.scope)?.filter(|s| !s.is_empty()) else {
            return Ok(None);
        };
        let Some(inner) = self.inner.extract(req)? else {
            return Ok(None);
        };
        Ok(Some(format!("tenant:{}:{scope}|{inner}", scope.len())))
    }
}

/// The request path is the key: one request at a time per URL path.
#[derive(Debug, Clone, Copy, Default)]
pub struct PathKey;

impl KeyExtractor for PathKey {
    fn extract(&self, req: &dyn RequestView) -> Result<Option<String>, MalformedKey> {
        Ok(Some(format!("path:{}", req.path())))
    }
}

/// Method and path are the key: `POST /jobs` and `GET /jobs` lock separately.
#[derive(Debug, Clone, Copy, Default)]
pub struct MethodPathKey;

impl KeyExtractor for MethodPathKey {
    fn extract(&self, req: &dyn RequestView) -> Result<Option<String>, MalformedKey> {
        Ok(Some(format!("route:{} {}", req.method(), req.path())))
    }
}

/// One key for every request: the wrapped service runs one request at a time.
#[derive(Debug, Clone)]
pub struct GlobalKey {
    key: String,
}

impl GlobalKey {
    /// Lock every request on `key`.
    pub fn new(key: impl Into<String>) -> Self {
        GlobalKey { key: key.into() }
    }
}

impl KeyExtractor for GlobalKey {
    fn extract(&self, _req: &dyn RequestView) -> Result<Option<String>, MalformedKey> {
        Ok(Some(self.key.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(headers: &[(&str, &str)]) -> http::Request<()> {
        let mut b = http::Request::builder().method("POST").uri("/a/b?q=1");
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(()).unwrap()
    }

    #[test]
    fn idempotency_key_accepts_quoted_and_bare_values() {
        assert_eq!(IdempotencyKey::parse(b"\"abc\"").unwrap(), "abc");
        assert_eq!(IdempotencyKey::parse(b"abc").unwrap(), "abc");
        assert_eq!(IdempotencyKey::parse(br#""a\"b\\c""#).unwrap(), r#"a"b\c"#);
        assert_eq!(IdempotencyKey::parse(b"  \"x y\" ").unwrap(), "x y");
    }

    #[test]
    fn idempotency_key_refuses_malformed_values() {
        for bad in [
            &b"\"\""[..],
            b"",
            b"\"abc",
            b"a\"bc",
            b"\"a\"b\"",
            b"\"a\\nb\"",
            b"caf\xc3\xa9",
        ] {
            assert!(IdempotencyKey::parse(bad).is_err(), "{bad:?} accepted");
        }
        let long = vec![b'k'; MAX_IDEMPOTENCY_KEY_LEN + 1];
        assert!(IdempotencyKey::parse(&long).is_err());
        let max = vec![b'k'; MAX_IDEMPOTENCY_KEY_LEN];
        assert!(IdempotencyKey::parse(&max).is_ok());
    }

    #[test]
    fn scoped_keys_of_different_tenants_differ_and_need_the_scope() {
        let k = ScopedKey::new(HeaderName::from_static("x-tenant"), IdempotencyKey::new());
        let a = k.extract(&req(&[("x-tenant", "a|b"), ("idempotency-key", "c")]));
        let b = k.extract(&req(&[("x-tenant", "a"), ("idempotency-key", "b|c")]));
        assert_ne!(a.unwrap(), b.unwrap());
        assert_eq!(k.extract(&req(&[("idempotency-key", "c")])).unwrap(), None);
    }

    #[test]
    fn path_and_method_keys_ignore_the_query() {
        assert_eq!(PathKey.extract(&req(&[])).unwrap().unwrap(), "path:/a/b");
        assert_eq!(
            MethodPathKey.extract(&req(&[])).unwrap().unwrap(),
            "route:POST /a/b"
        );
    }

    #[test]
    fn header_key_treats_empty_as_missing() {
        let k = HeaderKey::new(HeaderName::from_static("x-k"));
        assert_eq!(k.extract(&req(&[("x-k", " ")])).unwrap(), None);
        assert_eq!(k.extract(&req(&[("x-k", "v")])).unwrap().unwrap(), "v");
    }
}
