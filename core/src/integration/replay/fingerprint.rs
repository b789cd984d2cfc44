//! The request fingerprint: what makes a retry "the same request" as the one that ran,
//! fed chunk by chunk as the request body streams in ([`Fingerprinter`]).

use std::sync::Arc;

use bytes::Bytes;
use http::HeaderName;
use sha2::{Digest, Sha256};

use super::canonical_json::canonical_json;
use crate::key::RequestView;

/// A part an application adds to the fingerprint: the request's head and its whole body
/// in, any bytes out (a value an earlier layer put in the extensions, a route parameter).
/// Two requests with one idempotency key are the same request when the default
/// fingerprint and this part both agree; otherwise the second is answered `422`.
pub type FingerprintFn = Arc<dyn Fn(&dyn RequestView, &[u8]) -> Bytes + Send + Sync>;

/// Which fingerprint a layer takes: the default one, over the body's bytes or its
/// canonical JSON, with or without the authority, and the application's part, if any.
/// There is no way to leave out another part of the default: a fingerprint that forgot the
/// query or the full target would replay one route's response to another.
#[derive(Clone, Default)]
// Reached only through the hidden `settings` module, by tower-lock's builders: not an API
// of this crate.
#[allow(missing_docs, missing_debug_implementations)]
pub struct FingerprintKind {
    /// The body as canonical JSON (its bytes when it is not JSON), not its bytes.
    pub canonical_json: bool,
    /// The application's part.
    pub extra: Option<FingerprintFn>,
    /// The authority (host and port) counts: for a layer in front of several hosts whose
    /// names select different resources. Off by default, so that a retry sent to another
    /// node of the fleet (another address, an internal and an external name) is replayed.
    pub authority: bool,
}

/// The default fingerprint, fed while the body streams in: SHA-256 over length-delimited
/// fields (a version tag, the method, the full original target's path and query, the
/// authority when the layer counts it, every value of the content type, and every value of
/// each header the layer names), then the body bytes and, last, the body's length.
///
/// Every field before the body carries its length (and absent values a marker of their
/// own), each header's values are preceded by their count, and the body's length closes
/// the input, so no two different requests feed the same bytes: moving a byte from the
/// path into the query, from one header value into the next, or from one header into the
/// next, changes the fingerprint.
///
/// The target is the one the client sent (axum's original URI inside a nested router), so a
/// key reused on another route is another request (`422`), never a replay of that route's
/// response. The authority is not, by default: the nodes of one service answer one
/// resource under several addresses, and a client may retry on any of them. (A layer whose
/// hosts name different resources, virtual-host tenants, must scope its keys by the host,
/// `scope_by(AuthorityKey::new())`, or at least count it: unscoped and uncounted, one
/// host's stored response is replayed to another's request with the same key.)
pub(crate) struct Hasher {
    sha: Sha256,
    body_len: u64,
}

impl Hasher {
    pub(crate) fn new(req: &dyn RequestView, headers: &[HeaderName], authority: bool) -> Self {
        let mut sha = Sha256::new();
        // The version tag says which fields follow: v3 has the authority as an option.
        field(&mut sha, b"tower-lock fingerprint v3");
        field(&mut sha, req.method().as_bytes());
        let (path, query) = req.original_target();
        field(&mut sha, path.as_bytes());
        optional(&mut sha, query.map(str::as_bytes));
        optional(&mut sha, req.authority().filter(|_| authority));
        all_values(&mut sha, req, "content-type");
        for name in headers {
            field(&mut sha, name.as_str().as_bytes());
            all_values(&mut sha, req, name.as_str());
        }
        Self { sha, body_len: 0 }
    }

    pub(crate) fn update(&mut self, chunk: &[u8]) {
        self.sha.update(chunk);
        self.body_len += chunk.len() as u64;
    }

    pub(crate) fn finish(mut self) -> Bytes {
        self.sha.update(self.body_len.to_be_bytes());
        Bytes::copy_from_slice(&self.sha.finalize())
    }
}

/// How many values header `name` has, then each of them length-delimited (so that no
/// values and one empty value differ, and values cannot shift between headers).
fn all_values(sha: &mut Sha256, req: &dyn RequestView, name: &str) {
    let count = req.header_values(name).count() as u64;
    sha.update(count.to_be_bytes());
    for value in req.header_values(name) {
        field(sha, value);
    }
}

fn field(sha: &mut Sha256, bytes: &[u8]) {
    sha.update((bytes.len() as u64).to_be_bytes());
    sha.update(bytes);
}

fn optional(sha: &mut Sha256, bytes: Option<&[u8]>) {
    match bytes {
        None => sha.update([0]),
        Some(b) => {
            sha.update([1]);
            field(sha, b);
        }
    }
}

/// A request's fingerprint, fed while the body streams in.
pub(crate) struct Fingerprinter {
    hasher: Hasher,
    /// Fed the whole body at the end, as canonical JSON.
    json: bool,
    extra: Option<FingerprintFn>,
}

impl Fingerprinter {
    /// The fingerprint `kind` of `req`, whose named `headers` count besides the content type.
    pub(crate) fn new(
        kind: &FingerprintKind,
        headers: &[HeaderName],
        req: &dyn RequestView,
    ) -> Self {
        Self {
            hasher: Hasher::new(req, headers, kind.authority),
            json: kind.canonical_json,
            extra: kind.extra.clone(),
        }
    }

    /// Feed the next chunk of the body.
    pub(crate) fn update(&mut self, chunk: &[u8]) {
        if !self.json {
            self.hasher.update(chunk);
        }
    }

    /// The fingerprint, once `body` (the whole body) has been fed.
    pub(crate) fn finish(mut self, req: &dyn RequestView, body: &[u8]) -> Bytes {
        if self.json {
            match canonical_json(body) {
                Some(canonical) => self.hasher.update(&canonical),
                None => self.hasher.update(body),
            }
        }
        let default = self.hasher.finish();
        let Some(extra) = self.extra else {
            return default;
        };
        // Both parts, length-delimited, under a tag of their own: no request with a part
        // shares a fingerprint with one without, and the part cannot pose as the default.
        let mut sha = Sha256::new();
        field(&mut sha, b"tower-lock fingerprint v2 with a part");
        field(&mut sha, &default);
        field(&mut sha, &extra(req, body));
        Bytes::copy_from_slice(&sha.finalize())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fp(uri: &str, headers: &[(&str, &str)], body: &[&[u8]], named: &[&str]) -> Bytes {
        let mut req = http::Request::post(uri);
        for (n, v) in headers {
            req = req.header(*n, *v);
        }
        let req = req.body(()).unwrap();
        let named: Vec<HeaderName> = named.iter().map(|n| n.parse().unwrap()).collect();
        let mut h = Hasher::new(&req, &named, true);
        for chunk in body {
            h.update(chunk);
        }
        h.finish()
    }

    #[test]
    fn each_field_counts_and_fields_cannot_bleed_into_each_other() {
        let base = fp("/a?x=1", &[], &[b"body"], &[]);
        assert_eq!(base.len(), 32);
        // Chunking does not matter; content does.
        assert_eq!(base, fp("/a?x=1", &[], &[b"bo", b"dy"], &[]));
        for other in [
            fp("/a?x=2", &[], &[b"body"], &[]),
            fp("/b?x=1", &[], &[b"body"], &[]),
            fp("/a", &[], &[b"body"], &[]),
            fp("/a?", &[], &[b"body"], &[]),
            fp("/a?x=1", &[], &[b"bodz"], &[]),
            fp("/a?x=1", &[], &[b""], &[]),
            fp("/a?x=1", &[("content-type", "text/plain")], &[b"body"], &[]),
            fp("/a?x=1", &[], &[b"body"], &["x-api-version"]),
            fp(
                "/a?x=1",
                &[("x-api-version", "2")],
                &[b"body"],
                &["x-api-version"],
            ),
        ] {
            assert_ne!(base, other);
        }
        // A header the layer does not name is not part of it.
        assert_eq!(base, fp("/a?x=1", &[("x-trace", "1")], &[b"body"], &[]));
        // Empty query and no query differ.
        assert_ne!(fp("/a?", &[], &[], &[]), fp("/a", &[], &[], &[]));
    }

    #[test]
    fn the_authority_counts_only_when_the_layer_says_so() {
        let with = |host: &str, authority: bool| {
            let req = http::Request::post(format!("http://{host}/a"))
                .body(())
                .unwrap();
            let mut h = Hasher::new(&req, &[], authority);
            h.update(b"body");
            h.finish()
        };
        // Another node's address, or another name: the same request by default.
        assert_eq!(with("10.0.0.1:4001", false), with("10.0.0.2:4002", false));
        assert_eq!(with("api.example", false), with("api.internal", false));
        // Counted: another request.
        assert_ne!(with("10.0.0.1:4001", true), with("10.0.0.2:4002", true));
        assert_ne!(with("api.example", true), with("api.example", false));
    }

    #[test]
    fn every_value_of_a_named_header_counts_in_order() {
        let named = &["x-scope"];
        let two = |a, b| fp("/a", &[("x-scope", a), ("x-scope", b)], &[b"x"], named);
        assert_ne!(two("read", "write"), two("read", "admin"));
        assert_ne!(two("read", "write"), two("write", "read"));
        assert_ne!(
            two("read", "write"),
            fp("/a", &[("x-scope", "read")], &[b"x"], named)
        );
        // Values cannot bleed into each other.
        assert_ne!(two("a,b", "c"), two("a", "b,c"));
        // The content type too.
        let ct = |v: &[(&str, &str)]| fp("/a", v, &[b"x"], &[]);
        assert_ne!(
            ct(&[("content-type", "a/b"), ("content-type", "c/d")]),
            ct(&[("content-type", "a/b")])
        );
    }
}
