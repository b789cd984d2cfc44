//! The lock key encoding: `<namespace>/<kind>/<value>`, injective in its three parts (see
//! [the module docs](super#the-lock-key)).

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

/// `<scope>/<value>`, the scope escaped (see [`escape_into`]), so that a scope holding a
/// `/` cannot pose as another scope's values: the value of a scoped extractor.
pub(crate) fn scoped(scope: &str, value: &str) -> String {
    let mut out = String::with_capacity(scope.len() + 1 + value.len());
    escape_into(&mut out, scope);
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

    /// Text made of separators, escapes, braces and the engine's own words.
    const PART: &str =
        "(/|%|%2F|%25|:|\\||\\{|\\}|lock|queue|fence|wake|idempotency-key|tenant|a|2F|25| ){0,6}";
}
