//! [`ScopedKey`]: the one scope combinator, any extractor's value scoping any other
//! extractor's key (as tower-layer's `Stack` chains any two layers).

use super::{ExtractError, HeaderKey, KeyExtractor, RequestView, encoding::scoped, kind};

/// Another extractor's key within a scope that a second extractor reads: two tenants (or
/// principals) sending the same inner key lock different keys. A request whose scope or
/// inner key is missing has no key; an empty scope is missing too.
///
/// Any extractor is a scope: a header ([`ScopedKey::new`]), the authenticated
/// [`Principal`](super::Principal) ([`ScopedKey::by`]), a closure. The idempotency
/// preset's `per_principal` and `scope_by` build this same type.
///
/// The value is `<scope>/<inner value>`, with `%` and `/` in the scope escaped as in the
/// [lock key](crate::key#the-lock-key), so that a scope containing `/` cannot pose as
/// another scope's keys, and a long scope written as its SHA-256. The kind is
/// `scope(<scope kind>,<inner kind>)` (see [the key kinds](crate::key#key-kinds)).
///
/// ```
/// use tower_lock::key::{HeaderKey, IdempotencyKey, KeyExtractor, ScopedKey};
///
/// let per_tenant = ScopedKey::new("x-tenant-id", IdempotencyKey::new());
/// let same = ScopedKey::by(HeaderKey::new("x-tenant-id"), IdempotencyKey::new());
/// assert_eq!(per_tenant.kind(), "scope(header=x-tenant-id,idempotency-key)");
/// assert_eq!(per_tenant.kind(), same.kind());
/// ```
#[derive(Debug, Clone)]
pub struct ScopedKey<S, K> {
    scope: S,
    inner: K,
    kind: String,
}

impl<K: KeyExtractor> ScopedKey<HeaderKey, K> {
    /// Scope `inner` by the value of the header named `scope` (any case): given as text,
    /// or as a `HeaderName` of either `http` version, as for
    /// [`HeaderKey::new`]; the same as `ScopedKey::by(HeaderKey::new(scope), inner)`. A
    /// name that is not a valid header name makes `LockLayerBuilder::build` fail with
    /// [`ConfigError::Extractor`](crate::ConfigError::Extractor).
    ///
    /// ```
    /// use tower_lock::{ConfigError, LockEngine, LockLayer, key::{IdempotencyKey, ScopedKey}};
    ///
    /// let per_tenant = ScopedKey::new("X-Tenant-Id", IdempotencyKey::new());
    /// let layer = LockLayer::builder(LockEngine::in_memory()).key(per_tenant).build();
    /// assert!(layer.is_ok());
    /// let bad = ScopedKey::new("x tenant", IdempotencyKey::new());
    /// let bad = LockLayer::builder(LockEngine::in_memory()).key(bad).build();
    /// assert!(matches!(bad, Err(ConfigError::Extractor(_))));
    /// ```
    pub fn new(scope: impl AsRef<str>, inner: K) -> Self {
        Self::by(HeaderKey::new(scope), inner)
    }
}

impl<S: KeyExtractor, K: KeyExtractor> ScopedKey<S, K> {
    /// Scope `inner` by the value `scope` extracts.
    pub fn by(scope: S, inner: K) -> Self {
        let kind = kind::scope(scope.kind(), inner.kind());
        Self { scope, inner, kind }
    }
}

impl<S: KeyExtractor, K: KeyExtractor> KeyExtractor for ScopedKey<S, K> {
    fn extract(&self, req: &dyn RequestView) -> Result<Option<String>, ExtractError> {
        let Some(scope) = self.scope.extract_ref(req)? else {
            return Ok(None);
        };
        if scope.is_empty() {
            return Err(ExtractError::missing(format!(
                "a value for the scope ({}): it is empty",
                self.scope.kind()
            )));
        }
        let Some(inner) = self.inner.extract_ref(req)? else {
            return Ok(None);
        };
        Ok(Some(scoped(&scope, &inner)))
    }

    fn kind(&self) -> &str {
        &self.kind
    }

    fn validate(&self) -> Result<(), String> {
        self.scope.validate()?;
        self.inner.validate()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::{IdempotencyKey, test_request as req};

    #[test]
    fn scoped_keys_of_different_tenants_differ_and_need_the_scope() {
        let k = ScopedKey::new("x-tenant", IdempotencyKey::new());
        let a = k.extract(&req(&[("x-tenant", "a|b"), ("idempotency-key", "c")]));
        let b = k.extract(&req(&[("x-tenant", "a"), ("idempotency-key", "b|c")]));
        assert_ne!(a.unwrap(), b.unwrap());
        let missing = k.extract(&req(&[("idempotency-key", "c")])).unwrap_err();
        assert_eq!(missing.kind(), crate::key::ExtractErrorKind::Missing);
        assert!(missing.reason().contains("x-tenant"), "{missing}");
    }

    #[test]
    fn scoped_values_escape_the_scope() {
        let k = ScopedKey::new("x-tenant", IdempotencyKey::new());
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
    fn any_extractor_scopes_any_key() {
        let k = ScopedKey::by(crate::key::PathKey, IdempotencyKey::new());
        assert_eq!(k.kind(), "scope(path,idempotency-key)");
        let value = k.extract(&req(&[("idempotency-key", "k")])).unwrap();
        assert_eq!(value.as_deref(), Some("%2Fa%2Fb/k"));
    }
}
