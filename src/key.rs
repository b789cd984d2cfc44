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
//! assert_eq!(per_tenant.kind(), "header=x-tenant-id");
//! assert_eq!(per_tenant.extract(&req).unwrap().as_deref(), Some("acme"));
//! assert_eq!(idempotent.kind(), "scoped(x-tenant-id,idempotency-key)");
//! assert_eq!(idempotent.extract(&req).unwrap().as_deref(), Some("acme/8e03978e"));
//! assert_eq!(per_account.kind(), "custom");
//! assert_eq!(per_account.extract(&req).unwrap().as_deref(), Some("7"));
//! ```
//!
//! # The lock key
//!
//! Keys are data, never syntax: whatever a client sends, it cannot produce the lock key of
//! another layer or of another extractor. An extractor gives only the *value* of a request
//! (`acme`, `8e03978e`, `/reports/7`); the layer names its lock with three parts,
//!
//! ```text
//! <namespace>/<kind>/<value>
//! ```
//!
//! where the namespace is the layer's
//! [`namespace`](crate::LockLayerBuilder::namespace) (empty by default), the kind is the
//! extractor's [`KeyExtractor::kind`], and in the namespace and the kind `%` is written
//! `%25` and `/` is written `%2F` (see [`encode`]). Neither of the first two parts then
//! holds a bare `/`, so the first two `/` of a key always end them, the value is all the
//! rest, and different (namespace, kind, value) triples always give different keys. The
//! client's text is only ever the value, after both separators.
//!
//! | layer | request | lock key |
//! |---|---|---|
//! | `LockLayer::idempotency(engine)` | `Idempotency-Key: "8e03978e"` | `/idempotency-key/8e03978e` |
//! | `.namespace("billing").key(HeaderKey::new(x_tenant_id))` | `X-Tenant-Id: acme` | `billing/header=x-tenant-id/acme` |
//! | `.key(ScopedKey::new(x_tenant_id, IdempotencyKey::new()))` | both headers | `/scoped(x-tenant-id,idempotency-key)/acme/8e03978e` |
//! | `.key(PathKey)` | `POST /reports/7` | `/path//reports/7` |
//!
//! A key longer than [`MAX_KEY_LEN`](crate::engine::MAX_KEY_LEN) bytes, or one with a
//! control character, is answered `400` with the `malformed-key` problem type. Characters
//! with a meaning to Redis (`{`, `}`, `:`) are plain data too: the Redis backend derives
//! its own key names and hash tags from the whole lock key.
//!
//! ## Which layers share locks
//!
//! Two layers lock each other out exactly when they have the same namespace, extractors of
//! the same kind, and requests with the same value. That is deliberate, and it is how
//! several routes share one lock: give each route's layer the same namespace and the same
//! extractor (for example a tenant header), or wrap them all in one layer. To keep two
//! layers apart, give them different namespaces.
//!
//! Closures, and extractors that do not override [`KeyExtractor::kind`], are all of the
//! kind `custom`: two such layers with one namespace share their locks whenever their
//! values match. Give each layer with a closure its own namespace (or give your extractor
//! type a kind of its own).
//!
//! Direct users of the engine can take a layer's lock with
//! [`RequestLocker::lock_key`](crate::integration::RequestLocker::lock_key), for example a background job
//! that must not run while a tenant's requests do.

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
/// [`extract`](Self::extract) gives the request's *value*: `Ok(Some(value))` locks it;
/// `Ok(None)` means the request has no key (the layer's missing-key policy decides: pass
/// through unlocked, or `400`); `Err` means a key was given but is malformed (`400`). The
/// layer then names the lock `<namespace>/<kind>/<value>` (see [the module
/// docs](self#the-lock-key)) and validates it as a [`LockKey`](crate::LockKey) (at most
/// 512 bytes, no control characters); a key that fails is also answered `400`.
///
/// The value needs no prefix or kind word of its own: the layer adds the extractor's
/// [`kind`](Self::kind), so two extractors of different kinds never share a lock.
///
/// Closures `Fn(&dyn RequestView) -> Option<String>` are extractors, of the kind `custom`.
pub trait KeyExtractor: Send + Sync + 'static {
    /// The value of `req` to lock on.
    fn extract(&self, req: &dyn RequestView) -> Result<Option<String>, MalformedKey>;

    /// What the value is: part of every lock key, so that the same value read by
    /// extractors of different kinds (a tenant header, an idempotency key, a path) names
    /// different locks. Extractors of one kind in layers of one namespace share their
    /// locks.
    ///
    /// The built-in extractors each have a fixed kind (`header=<name>`,
    /// `idempotency-key`, `scoped(<header>,<inner kind>)`, `path`, `method-path`,
    /// `global`). The default is `custom`; override it to keep an extractor type's
    /// locks apart from those of closures and other types. The layer reads it once, when
    /// it is built.
    fn kind(&self) -> &str {
        "custom"
    }
}

/// The lock key text of `value`, read by an extractor of kind `kind`, in a layer with
/// namespace `namespace`: `<namespace>/<kind>/<value>`, with `%` and `/` in the namespace
/// and the kind escaped as `%25` and `%2F`. Different triples give different texts (see
/// [the module docs](self#the-lock-key)).
///
/// ```
/// use tower_lock::key::encode;
///
/// assert_eq!(encode("", "idempotency-key", "8e03978e"), "/idempotency-key/8e03978e");
/// assert_eq!(encode("billing", "header=x-tenant-id", "acme"), "billing/header=x-tenant-id/acme");
/// // Text cannot move between the parts:
/// assert_ne!(encode("a", "custom", "b/X"), encode("a/b", "custom", "X"));
/// assert_eq!(encode("a/b", "custom", "X"), "a%2Fb/custom/X");
/// ```
pub fn encode(namespace: &str, kind: &str, value: &str) -> String {
    let mut key = key_head(namespace, kind);
    key.push_str(value);
    key
}

/// `<namespace>/<kind>/`, escaped: the part of a layer's keys that is the same for every
/// request.
pub(crate) fn key_head(namespace: &str, kind: &str) -> String {
    let mut head = String::with_capacity(namespace.len() + kind.len() + 2);
    escape_into(&mut head, namespace);
    head.push('/');
    escape_into(&mut head, kind);
    head.push('/');
    head
}

/// Append `part` with `%` and `/` percent-encoded: the result holds no bare `/`, and
/// different parts give different results.
fn escape_into(out: &mut String, part: &str) {
    for c in part.chars() {
        match c {
            '%' => out.push_str("%25"),
            '/' => out.push_str("%2F"),
            c => out.push(c),
        }
    }
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
///
/// Its kind is `header=<name>`: layers keyed on different headers never share a lock.
#[derive(Debug, Clone)]
pub struct HeaderKey {
    name: HeaderName,
    kind: String,
}

impl HeaderKey {
    /// Lock on the value of header `name`.
    pub fn new(name: HeaderName) -> Self {
        let kind = format!("header={name}");
        HeaderKey { name, kind }
    }
}

impl KeyExtractor for HeaderKey {
    fn extract(&self, req: &dyn RequestView) -> Result<Option<String>, MalformedKey> {
        Ok(header_str(req, &self.name)?
            .filter(|v| !v.is_empty())
            .map(str::to_owned))
    }

    fn kind(&self) -> &str {
        &self.kind
    }
}

/// The longest idempotency key accepted, in characters.
pub const MAX_IDEMPOTENCY_KEY_LEN: usize = 255;

/// The `Idempotency-Key` header, as the IETF `draft-ietf-httpapi-idempotency-key-header`
/// defines it: a structured-field string (`"8e03978e"`), with the bare form (`8e03978e`)
/// also accepted. At most [`MAX_IDEMPOTENCY_KEY_LEN`] characters of printable ASCII;
/// anything else is malformed (`400`).
///
/// The value is the unquoted key; the kind is `idempotency-key`.
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
            Some(raw) => Self::parse(raw).map(Some),
        }
    }

    fn kind(&self) -> &str {
        "idempotency-key"
    }
}

/// Another extractor's key, scoped by a tenant or principal header: two tenants sending
/// the same inner key lock different keys. A request without the scope header has no key.
///
/// The value is `<scope>/<inner value>`, with `%` and `/` in the scope escaped as in the
/// [lock key](self#the-lock-key), so that a scope containing `/` cannot pose as another
/// scope's keys. The kind is `scoped(<scope header>,<inner kind>)`.
#[derive(Debug, Clone)]
pub struct ScopedKey<K> {
    scope: HeaderName,
    inner: K,
    kind: String,
}

impl<K: KeyExtractor> ScopedKey<K> {
    /// Scope `inner` by the value of header `scope`.
    pub fn new(scope: HeaderName, inner: K) -> Self {
        let kind = format!("scoped({scope},{})", inner.kind());
        ScopedKey { scope, inner, kind }
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
        let mut value = String::with_capacity(scope.len() + 1 + inner.len());
        escape_into(&mut value, scope);
        value.push('/');
        value.push_str(&inner);
        Ok(Some(value))
    }

    fn kind(&self) -> &str {
        &self.kind
    }
}

/// The request path is the key: one request at a time per URL path. The kind is `path`.
#[derive(Debug, Clone, Copy, Default)]
pub struct PathKey;

impl KeyExtractor for PathKey {
    fn extract(&self, req: &dyn RequestView) -> Result<Option<String>, MalformedKey> {
        Ok(Some(req.path().to_owned()))
    }

    fn kind(&self) -> &str {
        "path"
    }
}

/// Method and path are the key: `POST /jobs` and `GET /jobs` lock separately. The value
/// is `<method> <path>` (a method has no space); the kind is `method-path`.
#[derive(Debug, Clone, Copy, Default)]
pub struct MethodPathKey;

impl KeyExtractor for MethodPathKey {
    fn extract(&self, req: &dyn RequestView) -> Result<Option<String>, MalformedKey> {
        Ok(Some(format!("{} {}", req.method(), req.path())))
    }

    fn kind(&self) -> &str {
        "method-path"
    }
}

/// One key for every request: the wrapped service runs one request at a time. The kind
/// is `global`.
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

    fn kind(&self) -> &str {
        "global"
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
    fn scoped_values_escape_the_scope() {
        let k = ScopedKey::new(HeaderName::from_static("x-tenant"), IdempotencyKey::new());
        let value = |tenant, key| {
            k.extract(&req(&[("x-tenant", tenant), ("idempotency-key", key)]))
                .unwrap()
                .unwrap()
        };
        assert_eq!(value("acme", "k"), "acme/k");
        assert_eq!(value("a/b", "c"), "a%2Fb/c");
        assert_ne!(value("a/b", "c"), value("a", "b/c"));
        assert_ne!(value("a%2Fb", "c"), value("a/b", "c"));
    }

    #[test]
    fn path_and_method_keys_ignore_the_query() {
        assert_eq!(PathKey.extract(&req(&[])).unwrap().unwrap(), "/a/b");
        assert_eq!(
            MethodPathKey.extract(&req(&[])).unwrap().unwrap(),
            "POST /a/b"
        );
    }

    #[test]
    fn every_built_in_extractor_has_a_kind_of_its_own() {
        let tenant = || HeaderName::from_static("x-tenant");
        let header = HeaderKey::new(tenant());
        let idempotency = IdempotencyKey::new();
        let scoped = ScopedKey::new(tenant(), IdempotencyKey::new());
        let scoped_header =
            ScopedKey::new(tenant(), HeaderKey::new(HeaderName::from_static("x-k")));
        let global = GlobalKey::new("g");
        let closure = |_: &dyn RequestView| None;
        let kinds = [
            header.kind(),
            idempotency.kind(),
            scoped.kind(),
            scoped_header.kind(),
            PathKey.kind(),
            MethodPathKey.kind(),
            global.kind(),
            closure.kind(),
        ];
        assert_eq!(
            kinds,
            [
                "header=x-tenant",
                "idempotency-key",
                "scoped(x-tenant,idempotency-key)",
                "scoped(x-tenant,header=x-k)",
                "path",
                "method-path",
                "global",
                "custom",
            ]
        );
    }

    #[test]
    fn encode_escapes_the_namespace_and_the_kind_but_not_the_value() {
        assert_eq!(encode("", "path", "/a/b"), "/path//a/b");
        assert_eq!(encode("a/b%", "k/%", "v/%"), "a%2Fb%25/k%2F%25/v/%");
    }

    /// Decode a key made by [`encode`]: the inverse that makes it injective.
    fn decode(key: &str) -> (String, String, String) {
        fn unescape(part: &str) -> String {
            let mut out = String::new();
            let mut rest = part;
            while let Some(i) = rest.find('%') {
                out.push_str(&rest[..i]);
                out.push(match &rest[i..i + 3] {
                    "%25" => '%',
                    "%2F" => '/',
                    other => panic!("stray escape {other:?} in {key:?}", key = part),
                });
                rest = &rest[i + 3..];
            }
            out.push_str(rest);
            out
        }
        let (namespace, rest) = key.split_once('/').expect("a namespace");
        let (kind, value) = rest.split_once('/').expect("a kind");
        (unescape(namespace), unescape(kind), value.to_owned())
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]

        /// Every key decodes back to its namespace, kind and value, so no two triples
        /// share a key.
        #[test]
        fn encode_is_injective(
            namespace in PART,
            kind in PART,
            value in PART,
        ) {
            let key = encode(&namespace, &kind, &value);
            proptest::prop_assert_eq!(decode(&key), (namespace, kind, value));
        }
    }

    /// Text made of separators, escapes, braces and the engine's own words.
    const PART: &str =
        "(/|%|%2F|%25|:|\\||\\{|\\}|lock|queue|fence|wake|idempotency-key|tenant|a|2F|25| ){0,6}";

    #[test]
    fn header_key_treats_empty_as_missing() {
        let k = HeaderKey::new(HeaderName::from_static("x-k"));
        assert_eq!(k.extract(&req(&[("x-k", " ")])).unwrap(), None);
        assert_eq!(k.extract(&req(&[("x-k", "v")])).unwrap().unwrap(), "v");
    }
}
