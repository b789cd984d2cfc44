//! The grammar of key kinds, written once: the kind of a scope combinator, and what a
//! kind says about the parts of a request its extractor reads.

/// The kind of [`ScopedKey`](super::ScopedKey): `scope(<scope kind>,<inner kind>)`, the
/// form the idempotency preset's records have always been keyed with (a record written
/// before a deploy must be found after it).
pub(crate) fn scope(scope: &str, inner: &str) -> String {
    format!("scope({scope},{inner})")
}

/// The kind of [`Principal`](super::Principal), reserved for it: an extractor of this kind
/// (alone or inside a scope) reads the request's `http` extensions.
pub(crate) const PRINCIPAL: &str = "principal";

/// Whether an extractor of kind `kind` reads a principal from the request's `http`
/// extensions and finds no key without them: `kind` is [`PRINCIPAL`], or a scope with
/// it as a part. A framework whose requests carry no `http` extensions (actix-web)
/// refuses such a key when its middleware is made.
pub(crate) fn reads_principal(kind: &str) -> bool {
    kind.split(['(', ',', ')']).any(|part| part == PRINCIPAL)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn principals_are_found_in_any_scope() {
        assert!(reads_principal("principal"));
        assert!(reads_principal("scope(principal,idempotency-key)"));
        assert!(reads_principal(
            "scope(header=x-tenant,scope(principal,path))"
        ));
        assert!(!reads_principal(
            "scope(header=x-principal,idempotency-key)"
        ));
        assert!(!reads_principal("principals"));
        assert_eq!(scope("a", "b"), "scope(a,b)");
    }
}
