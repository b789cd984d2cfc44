//! [`ScopedKey`]: another extractor's key, scoped by a tenant or principal header.

use http::HeaderName;

use super::{
    ExtractError, KeyExtractor, RequestView,
    encoding::scoped,
    header::{header_str, parse_name},
};

/// Another extractor's key, scoped by a tenant or principal header: two tenants sending
/// the same inner key lock different keys. A request without the scope header has no key.
///
/// The value is `<scope>/<inner value>`, with `%` and `/` in the scope escaped as in the
/// [lock key](crate::key#the-lock-key), so that a scope containing `/` cannot pose as another
/// scope's keys, and a long scope written as its SHA-256. The kind is
/// `scoped(<scope header>,<inner kind>)`.
#[derive(Debug, Clone)]
pub struct ScopedKey<K> {
    scope: Result<HeaderName, String>,
    inner: K,
    kind: String,
}

impl<K: KeyExtractor> ScopedKey<K> {
    /// Scope `inner` by the value of the header named `scope` (any case): given as text,
    /// or as a `HeaderName` of either `http` version, as for
    /// [`HeaderKey::new`](super::HeaderKey::new). A name that is not a valid header name
    /// makes `LockLayerBuilder::build` fail with
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
        let scope = parse_name(scope.as_ref());
        let kind = match &scope {
            Ok(scope) => format!("scoped({scope},{})", inner.kind()),
            Err(_) => format!("scoped(,{})", inner.kind()),
        };
        Self { scope, inner, kind }
    }
}

impl<K: KeyExtractor> KeyExtractor for ScopedKey<K> {
    fn extract(&self, req: &dyn RequestView) -> Result<Option<String>, ExtractError> {
        // Unreachable through a built layer, which `validate` refused.
        let name = self
            .scope
            .as_ref()
            .map_err(|e| ExtractError::misconfigured(e.clone()))?;
        let scope = match header_str(req, name)? {
            None => return Err(ExtractError::missing(format!("the {name} header"))),
            Some("") => {
                return Err(ExtractError::missing(format!(
                    "a value in the {name} header: it is empty"
                )));
            }
            Some(scope) => scope,
        };
        let Some(inner) = self.inner.extract_ref(req)? else {
            return Ok(None);
        };
        Ok(Some(scoped(scope, &inner)))
    }

    fn kind(&self) -> &str {
        &self.kind
    }

    fn validate(&self) -> Result<(), String> {
        self.scope.as_ref().map_err(Clone::clone)?;
        self.inner.validate()
    }

    fn needs_extensions(&self) -> bool {
        self.inner.needs_extensions()
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
}
