//! Whose requests share idempotency records: the scope decision every idempotency layer
//! makes when it is built, and the key extractor it turns into.
//!
//! The IETF draft's security considerations ask for a key that combines the client's
//! `Idempotency-Key` with attributes known only to the server, so that one client cannot
//! receive (or block) another's stored response by sending the same key. Keys such as
//! `order-1` are common, so without a scope two callers collide routinely, not only
//! through malice.

use std::{borrow::Cow, fmt, sync::Arc};

use crate::{
    ConfigError, KeyError,
    engine::MAX_KEY_LEN,
    key::{ExtractError, RequestView},
    key::{
        KeyExtractor, MAX_IDEMPOTENCY_KEY_LEN, ScopedKey,
        encoding::{MAX_SCOPE_LEN, key_head, scoped},
    },
};

/// The scope a builder was given.
#[derive(Clone)]
pub enum Scope {
    /// Every caller shares one record per key: anonymous public endpoints only.
    Unscoped,
    /// Records are per value of this extractor (a principal, a tenant the server derived).
    By(Arc<dyn KeyExtractor>),
}

impl fmt::Debug for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unscoped => f.write_str("Unscoped"),
            Self::By(scope) => f.debug_tuple("By").field(&scope.kind()).finish(),
        }
    }
}

impl Scope {
    /// The lock key extractor of a layer with this scope and idempotency `key`: the public
    /// [`ScopedKey`], whose kind is `scope(<scope kind>,<key kind>)`.
    pub fn key(&self, key: Arc<dyn KeyExtractor>) -> Arc<dyn KeyExtractor> {
        match self {
            Self::Unscoped => key,
            Self::By(scope) => Arc::new(ScopedKey::by(ServerScope(scope.clone()), key)),
        }
    }

    /// Whether a layer with `namespace` and key `kind` (the kind of [`key`](Self::key)'s
    /// extractor) has room in its lock keys for the longest legal idempotency key under
    /// this scope: a scope takes at most [`MAX_SCOPE_LEN`] bytes (a longer one is written as
    /// its digest), and the namespace and the kind are the server's, so a key too long for
    /// them must be refused here rather than blamed on the client.
    pub fn check_room(&self, namespace: &str, kind: &str) -> Result<(), ConfigError> {
        let scope = match self {
            Self::Unscoped => 0,
            Self::By(_) => MAX_SCOPE_LEN + "/".len(),
        };
        let len = key_head(namespace, kind).len() + scope + MAX_IDEMPOTENCY_KEY_LEN;
        if len > MAX_KEY_LEN {
            let max = MAX_KEY_LEN;
            return Err(ConfigError::Namespace(KeyError::TooLong { len, max }));
        }
        Ok(())
    }

    /// The value a scoped layer's key has for `scope` and idempotency key `key`, for
    /// operators who look up or delete a record (see
    /// `IdempotencyLayer::record`); `None` when the
    /// layer is scoped but no scope was given, or the reverse.
    pub fn value(&self, scope: Option<&str>, key: &str) -> Option<String> {
        match (self, scope) {
            (Self::Unscoped, None) => Some(key.to_owned()),
            (Self::By(_), Some(scope)) => Some(scoped(scope, key)),
            _ => None,
        }
    }
}

/// A scope the server derives (`per_principal`, `scope_by`): one that finds nothing in a
/// request is the server's mistake, never the client's (a client cannot send a scope): an
/// authentication middleware forgotten or ordered after the layer. So a closure that
/// returns `None` answers `500 misconfigured` and logs the cause, as a missing
/// [`Principal`](crate::key::Principal) does, rather than a `400` that blames the client.
/// Its kind is the scope's own, so lock keys are unchanged.
struct ServerScope(Arc<dyn KeyExtractor>);

impl KeyExtractor for ServerScope {
    fn extract(&self, req: &dyn RequestView) -> Result<Option<String>, ExtractError> {
        Ok(self.extract_ref(req)?.map(Cow::into_owned))
    }

    fn extract_ref<'r>(
        &self,
        req: &'r dyn RequestView,
    ) -> Result<Option<Cow<'r, str>>, ExtractError> {
        match self.0.extract_ref(req)? {
            Some(scope) => Ok(Some(scope)),
            None => Err(ExtractError::misconfigured(format!(
                "the idempotency scope ({}) found nothing in the request: the scope is the \
                 server's to derive, so install the middleware that provides it (an \
                 authentication layer) before this layer, or route unauthenticated \
                 requests around it",
                self.0.kind()
            ))),
        }
    }

    fn kind(&self) -> &str {
        self.0.kind()
    }

    fn validate(&self) -> Result<(), String> {
        self.0.validate()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::{IdempotencyKey, Principal, test_request as req};

    #[derive(Clone)]
    struct User(&'static str);

    impl fmt::Display for User {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.0)
        }
    }

    #[test]
    fn scoped_values_escape_the_scope_and_need_both_parts() {
        let tenant: Arc<dyn KeyExtractor> = Arc::new(crate::key::HeaderKey::new(
            http::HeaderName::from_static("x-tenant"),
        ));
        let k = Scope::By(tenant).key(Arc::new(IdempotencyKey::new()));
        let value = |t, key| {
            k.extract(&req(&[("x-tenant", t), ("idempotency-key", key)]))
                .unwrap()
        };
        assert_eq!(value("acme", "k").as_deref(), Some("acme/k"));
        assert_ne!(value("a/b", "c"), value("a", "b/c"));
        let missing = k.extract(&req(&[("idempotency-key", "k")])).unwrap_err();
        assert_eq!(missing.kind(), crate::key::ExtractErrorKind::Missing);
        assert!(missing.reason().contains("x-tenant"), "{missing}");
        assert_eq!(k.kind(), "scope(header=x-tenant,idempotency-key)");
        assert_eq!(
            Scope::By(Arc::new(Principal::<User>::new())).value(Some("a/b"), "c"),
            Some("a%2Fb/c".to_owned())
        );
    }

    #[test]
    fn the_namespace_must_leave_room_for_the_longest_key_under_any_scope() {
        let by = Scope::By(Arc::new(Principal::<User>::new()));
        let kind = by.key(Arc::new(IdempotencyKey::new())).kind().to_owned();
        assert!(by.check_room("", &kind).is_ok());
        assert!(by.check_room(&"n".repeat(150), &kind).is_ok());
        let too_long = by.check_room(&"n".repeat(200), &kind);
        assert!(
            matches!(
                too_long,
                Err(ConfigError::Namespace(KeyError::TooLong {
                    len: 556,
                    max: 512
                }))
            ),
            "{too_long:?}"
        );
        assert!(
            Scope::Unscoped
                .check_room(&"n".repeat(200), "idempotency-key")
                .is_ok()
        );
        let build = |namespace: &str| {
            // The builder is tower-lock's (a dev-dependency, hence its own copy of this
            // crate's types).
            tower_lock::IdempotencyLayer::builder(tower_lock::LockEngine::in_memory())
                .namespace(namespace)
                .per_principal::<User>()
        };
        assert!(build(&"n".repeat(150)).build().is_ok());
        assert!(matches!(
            build(&"n".repeat(200)).build(),
            Err(tower_lock::ConfigError::Namespace(_))
        ));
        // A key of the application's own has no known bound: its values are checked per
        // request, as in any layer.
        let custom = build(&"n".repeat(200)).key(tower_lock::key::HeaderKey::new("x-key"));
        assert!(custom.build().is_ok());
    }

    #[test]
    fn principals_come_from_the_extensions() {
        let k = Scope::By(Arc::new(Principal::<User>::new())).key(Arc::new(IdempotencyKey::new()));
        let mut r = req(&[("idempotency-key", "k")]);
        let none = k.extract(&r).unwrap_err();
        assert_eq!(
            none.kind(),
            crate::key::ExtractErrorKind::Misconfigured,
            "no principal is the server's mistake"
        );
        r.extensions_mut().insert(User("alice"));
        assert_eq!(k.extract(&r).unwrap().as_deref(), Some("alice/k"));
        assert_eq!(k.kind(), "scope(principal,idempotency-key)");
    }
}
