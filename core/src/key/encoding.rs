//! The lock key encoding: `<namespace>/<kind>/<value>`, injective in its three parts (see
//! [the module docs](super#the-lock-key)).

use std::fmt::Write as _;

use sha2::{Digest, Sha256};

/// The lock key text of `value`, read by an extractor of kind `kind`, in a layer with
/// namespace `namespace`: `<namespace>/<kind>/<value>`, with `%` and `/` in the namespace
/// and the kind escaped as `%25` and `%2F`. Different triples give different texts (see
/// [the module docs](crate::key#the-lock-key)).
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
pub(crate) fn escape_into(out: &mut String, part: &str) {
    for c in part.chars() {
        match c {
            '%' => out.push_str("%25"),
            '/' => out.push_str("%2F"),
            c => out.push(c),
        }
    }
}

/// The most bytes a scope takes in a key: a longer one is written as its digest (see
/// [`scoped`]), so that a legal key under any scope fits in a lock key.
pub(crate) const MAX_SCOPE_LEN: usize = DIGEST_MARK.len() + 64;

/// What begins a scope written as its digest. An escaped scope never holds it: every `%`
/// in one begins `%25` or `%2F`.
const DIGEST_MARK: &str = "%#";

/// `<scope>/<value>`: the value of a scoped extractor. The scope is escaped (see
/// [`escape_into`]), so that a scope holding a `/` cannot pose as another scope's values;
/// an escaped scope longer than [`MAX_SCOPE_LEN`] bytes (an issuer URL and a subject, say)
/// is written `%#` and the 64 hex digits of its SHA-256 instead, so that the server's own
/// scope never turns a client's legal key into one too long to lock. The two forms cannot
/// meet (an escaped scope holds no `%#`), and two long scopes share a digest only if they
/// collide under SHA-256.
pub(crate) fn scoped(scope: &str, value: &str) -> String {
    let mut out = String::with_capacity(scope.len().min(MAX_SCOPE_LEN) + 1 + value.len());
    escape_into(&mut out, scope);
    if out.len() > MAX_SCOPE_LEN {
        out.clear();
        out.push_str(DIGEST_MARK);
        for byte in Sha256::digest(scope.as_bytes()) {
            // Writing to a `String` cannot fail.
            let _ = write!(out, "{byte:02x}");
        }
    }
    out.push('/');
    out.push_str(value);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

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
                    other => panic!("stray escape {other:?} in {part:?}"),
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

    /// Decode a scoped value made by [`scoped`]: its scope (or the scope's digest, in
    /// hex) and the value, the inverse that makes it injective.
    fn decode_scoped(scoped_value: &str) -> (Result<String, String>, String) {
        let (scope, value) = scoped_value.split_once('/').expect("a scope");
        let scope = match scope.strip_prefix(DIGEST_MARK) {
            Some(hex) => Err(hex.to_owned()),
            None => Ok(decode(&format!("{scope}/k/")).0),
        };
        (scope, value.to_owned())
    }

    fn hex_digest(scope: &str) -> String {
        Sha256::digest(scope.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    #[test]
    fn a_long_scope_is_written_as_its_digest_and_a_short_one_as_is() {
        let short = "s".repeat(MAX_SCOPE_LEN);
        assert_eq!(scoped(&short, "k"), format!("{short}/k"));
        // 22 slashes escape to 66 bytes: kept; 23 do not fit.
        assert_eq!(
            scoped(&"/".repeat(22), "k"),
            format!("{}/k", "%2F".repeat(22))
        );
        let long = "/".repeat(23);
        assert_eq!(scoped(&long, "k"), format!("%#{}/k", hex_digest(&long)));
        let issuer = format!("https://login.example.com/{}|subject", "t".repeat(200));
        let value = scoped(&issuer, "order-1");
        assert_eq!(value.len(), MAX_SCOPE_LEN + "/order-1".len());
        assert_eq!(
            decode_scoped(&value),
            (Err(hex_digest(&issuer)), "order-1".to_owned())
        );
        assert_ne!(value, scoped(&format!("{issuer}2"), "order-1"));
        // A short scope that looks like a digest is escaped, so it never is one.
        let lookalike = format!("%#{}", hex_digest(&issuer));
        assert_ne!(scoped(&lookalike, "order-1"), value);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]

        /// Every scoped value decodes back to its scope (or, for a long one, its digest)
        /// and its value, so no two (scope, value) pairs share one but through a SHA-256
        /// collision; and a scope never takes more than `MAX_SCOPE_LEN` bytes.
        #[test]
        fn scoped_is_injective(scope in LONG_PART, value in PART) {
            let scoped_value = scoped(&scope, &value);
            let (decoded, rest) = decode_scoped(&scoped_value);
            proptest::prop_assert_eq!(rest, value);
            match decoded {
                Ok(decoded) => proptest::prop_assert_eq!(decoded, scope),
                Err(hex) => proptest::prop_assert_eq!(hex, hex_digest(&scope)),
            }
            proptest::prop_assert!(scoped_value.find('/').unwrap() <= MAX_SCOPE_LEN);
        }
    }

    /// Scopes either side of the digest threshold.
    const LONG_PART: &str = "(/|%|%2F|%25|%#|a|\\{|\\}|:){0,40}";

    /// Text made of separators, escapes, braces and the engine's own words.
    const PART: &str =
        "(/|%|%2F|%25|:|\\||\\{|\\}|lock|queue|fence|wake|idempotency-key|tenant|a|2F|25| ){0,6}";
}
