//! The request fingerprint: what makes a retry "the same request" as the one that ran,
//! fed chunk by chunk as the request body streams in ([`Fingerprinter`]).

use std::sync::Arc;

use bytes::Bytes;
use http::HeaderName;
use sha2::{Digest, Sha256};

use crate::key::RequestView;

/// A user-supplied fingerprint: the request's head and its whole body in, any bytes out
/// (for example a hash of canonical JSON, so that key order or whitespace do not count).
/// Two requests with one idempotency key and different fingerprints are answered `422`.
pub type FingerprintFn = Arc<dyn Fn(&dyn RequestView, &[u8]) -> Bytes + Send + Sync>;

/// Which fingerprint a layer takes.
#[derive(Clone)]
pub(crate) enum FingerprintKind {
    /// [`Hasher`] over the body's bytes.
    Sha256,
    /// [`Hasher`] over the body's canonical JSON (its bytes when it is not JSON).
    CanonicalJson,
    /// The user's own.
    Custom(FingerprintFn),
}

/// A JSON document written in one form: object keys sorted (by their UTF-8 bytes), no
/// whitespace, strings and numbers as `serde_json` writes them. `None` if `body` is not
/// JSON.
pub(crate) fn canonical_json(body: &[u8]) -> Option<Vec<u8>> {
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    let mut out = Vec::with_capacity(body.len());
    write_canonical(&value, &mut out);
    Some(out)
}

fn write_canonical(value: &serde_json::Value, out: &mut Vec<u8>) {
    use serde_json::Value;
    match value {
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(item, out);
            }
            out.push(b']');
        }
        Value::Object(map) => {
            // Sorted here, whatever map type `serde_json` was built with (its
            // `preserve_order` feature keeps insertion order).
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
            out.push(b'{');
            for (i, (key, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                serde_json::to_writer(&mut *out, key).expect("a string serializes");
                out.push(b':');
                write_canonical(item, out);
            }
            out.push(b'}');
        }
        scalar => serde_json::to_writer(&mut *out, scalar).expect("a scalar serializes"),
    }
}

/// The default fingerprint, fed while the body streams in: SHA-256 over length-delimited
/// fields (a version tag, the method, the full original target's path and query, the
/// authority, every value of the content type, and every value of each header the layer
/// names), then the body bytes and, last, the body's length.
///
/// Every field before the body carries its length (and absent values a marker of their
/// own), each header's values are preceded by their count, and the body's length closes
/// the input, so no two different requests feed the same bytes: moving a byte from the
/// path into the query, from one header value into the next, or from one header into the
/// next, changes the fingerprint.
///
/// The target is the one the client sent (axum's original URI inside a nested router), and
/// the authority is part of it, so a key reused on another route or host name is another
/// request (`422`), never a replay of that route's or host's response.
pub(crate) struct Hasher {
    sha: Sha256,
    body_len: u64,
}

impl Hasher {
    pub(crate) fn new(req: &dyn RequestView, headers: &[HeaderName]) -> Self {
        let mut sha = Sha256::new();
        field(&mut sha, b"tower-lock fingerprint v2");
        field(&mut sha, req.method().as_bytes());
        let (path, query) = req.original_target();
        field(&mut sha, path.as_bytes());
        optional(&mut sha, query.map(str::as_bytes));
        optional(&mut sha, req.authority());
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

/// The default or the user's fingerprint, fed while the body streams in.
pub(crate) enum Fingerprinter {
    Sha256(Hasher),
    /// Fed the whole body at the end, as canonical JSON.
    Json(Hasher),
    Custom(FingerprintFn),
}

impl Fingerprinter {
    /// The fingerprint `kind` of `req`, whose named `headers` count besides the content type.
    pub(crate) fn new(
        kind: &FingerprintKind,
        headers: &[HeaderName],
        req: &dyn RequestView,
    ) -> Self {
        match kind {
            FingerprintKind::Custom(f) => Self::Custom(f.clone()),
            FingerprintKind::Sha256 => Self::Sha256(Hasher::new(req, headers)),
            FingerprintKind::CanonicalJson => Self::Json(Hasher::new(req, headers)),
        }
    }

    pub(crate) fn update(&mut self, chunk: &[u8]) {
        if let Self::Sha256(h) = self {
            h.update(chunk);
        }
    }

    pub(crate) fn finish(self, req: &dyn RequestView, body: &[u8]) -> Bytes {
        match self {
            Self::Sha256(h) => h.finish(),
            Self::Json(mut h) => {
                match canonical_json(body) {
                    Some(canonical) => h.update(&canonical),
                    None => h.update(body),
                }
                h.finish()
            }
            Self::Custom(f) => f(req, body),
        }
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
        let mut h = Hasher::new(&req, &named);
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
    fn canonical_json_ignores_key_order_and_whitespace_only() {
        let c = |s: &str| canonical_json(s.as_bytes());
        assert_eq!(
            c(r#"{"a":1, "b":[2, {"d":1,"c":2}]}"#),
            c(r#"{ "b":[2,{"c":2,"d":1}],"a":1}"#)
        );
        assert_eq!(c(r#"{"b":1,"a":2}"#).unwrap(), br#"{"a":2,"b":1}"#);
        assert_ne!(c(r#"{"a":1}"#), c(r#"{"a":2}"#));
        assert_ne!(c(r#"[1,2]"#), c(r#"[2,1]"#), "array order counts");
        assert_eq!(c("not json"), None);
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
